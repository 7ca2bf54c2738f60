"""A small MCQ stream in which presentations recur with new wording, for the real-model benchmark.

Twelve diagnoses in three groups (acute chest pain, headache, pelvic pain in women); each is
written four times with different patients and wording. Variants 1-2 form the training stream,
variants 3-4 the held-out stream (same shape: every diagnosis occurs twice, in new words).
Options: the group's four diagnoses plus one from another group, in a fixed shuffled order.
Written for this project; teaching-level vignettes, not clinical guidance.

    python benchmarks/recurring_stream.py OUT_DIR   # writes recurring_train.jsonl, recurring_test.jsonl
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

GROUPS: dict[str, dict[str, list[str]]] = {
    "chest pain": {
        "Aortic dissection": [
            "A 64-year-old man with long-standing poorly controlled hypertension has sudden tearing chest pain that "
            "radiates to his back between the shoulder blades. Blood pressure is 178/96 mm Hg in the right arm and "
            "132/80 mm Hg in the left. Chest radiograph shows a widened mediastinum.",
            "A 58-year-old woman describes a ripping pain that began abruptly in her anterior chest and moved to her "
            "interscapular back. The left radial pulse is weaker than the right and a new early diastolic murmur is "
            "heard. She has hypertension and stopped her medicines a month ago.",
            "Abrupt severe anterior chest pain 'like being torn apart' radiating to the back in a 70-year-old smoker "
            "with hypertension. Systolic pressures differ by 35 mm Hg between the arms; the mediastinum is wide on "
            "the film; troponin is normal.",
            "A tall 41-year-old man with Marfan syndrome develops sudden excruciating chest pain going straight "
            "through to his back. Pulses are unequal in the arms and a diastolic murmur of aortic regurgitation is "
            "new. Electrocardiogram shows no ST elevation.",
        ],
        "Pulmonary embolism": [
            "A 34-year-old woman taking oral contraceptives developed pleuritic chest pain and breathlessness after "
            "a 12-hour flight. Heart rate is 118/min, oxygen saturation 89% on room air, and her left calf is "
            "swollen and tender. The chest radiograph is clear.",
            "Three days after a hip replacement, a 67-year-old man becomes suddenly short of breath with sharp pain "
            "on inspiration. He is tachycardic at 122/min with saturation 88%; lungs are clear on auscultation. "
            "Electrocardiogram shows sinus tachycardia with an S1Q3T3 pattern.",
            "A 45-year-old woman on tamoxifen for breast cancer has sudden dyspnoea and pain when she breathes in, "
            "and coughs up a little blood. Pulse 115/min, saturation 90%, clear lungs, one leg swollen; D-dimer "
            "is markedly raised.",
            "After two weeks immobilised in a leg cast, a 29-year-old man is acutely breathless with pleuritic "
            "chest pain. He is hypoxic (saturation 87%) and tachycardic, the chest film is unremarkable, and "
            "the right ventricle is dilated on bedside echo.",
        ],
        "Acute pericarditis": [
            "A 27-year-old man had a viral upper respiratory infection last week. Now he has sharp central chest "
            "pain that worsens lying flat and eases when he sits up and leans forward. A scratchy friction rub is "
            "heard; electrocardiogram shows diffuse concave ST elevation with PR depression.",
            "Sharp retrosternal pain for two days in a 31-year-old woman, better sitting forward and worse on "
            "inspiration and when supine. There is a three-component rub at the left sternal edge and widespread "
            "saddle-shaped ST elevation in most leads.",
            "A 45-year-old man with a recent flu-like illness has positional chest pain relieved by leaning forward. "
            "Auscultation reveals a pericardial friction rub; the ECG has diffuse ST elevation and PR-segment "
            "depression; troponin is only slightly raised.",
            "Two weeks after a cold, a 23-year-old student has stabbing chest pain that radiates to the trapezius "
            "ridge and is relieved by sitting up and leaning forward. ECG: diffuse ST elevation, PR depression; a "
            "friction rub is audible.",
        ],
        "Tension pneumothorax": [
            "A 25-year-old motorcyclist is brought in after a crash with severe dyspnoea. Breath sounds are absent "
            "on the right, the right hemithorax is hyperresonant, the trachea is deviated to the left, neck veins "
            "are distended and blood pressure is 78/40 mm Hg.",
            "A ventilated 60-year-old man in intensive care suddenly desaturates with rising airway pressures and "
            "hypotension. The left chest does not move and has no breath sounds; it is hyperresonant, and the "
            "trachea has shifted to the right.",
            "A tall thin 22-year-old man stabbed in the chest is gasping, hypotensive at 80/50 mm Hg with "
            "distended jugular veins. One side of the chest is silent and hyperresonant and the trachea is pushed "
            "away from that side.",
            "After a fall from a ladder with rib fractures, a 48-year-old woman becomes progressively breathless "
            "and hypotensive. Her left hemithorax is hyperresonant with absent breath sounds, her trachea is "
            "deviated to the right, and her neck veins are engorged.",
        ],
        "Boerhaave syndrome": [
            "After a night of heavy drinking and repeated forceful vomiting, a 52-year-old man has severe "
            "retrosternal chest pain. Crepitus is felt over the neck and chest wall, and a crunching sound with "
            "each heartbeat is heard. He is febrile and tachycardic.",
            "A 46-year-old woman with bulimia has sudden severe lower chest pain after an episode of violent "
            "retching. There is subcutaneous emphysema in the neck; the chest film shows pneumomediastinum and a "
            "left pleural effusion.",
            "Violent vomiting after a large meal is followed by excruciating chest and upper abdominal pain in a "
            "60-year-old man. He has surgical emphysema in the supraclavicular fossae and Hamman's crunch; "
            "he rapidly becomes septic.",
            "A 39-year-old man binge drank and vomited many times, then developed severe chest pain radiating to "
            "the back with pain on swallowing. Neck crepitus is present and a contrast swallow shows leakage from "
            "the distal oesophagus.",
        ],
    },
    "headache": {
        "Subarachnoid hemorrhage": [
            "A 48-year-old woman has a sudden explosive headache, 'the worst of my life', that peaked within a "
            "minute while lifting a box. She vomited and has neck stiffness and photophobia; she is afebrile.",
            "While straining at stool, a 55-year-old man develops an instantaneous severe occipital headache and "
            "briefly loses consciousness. He has neck rigidity; CT head shows blood in the basal cisterns.",
            "A thunderclap headache reaching maximal intensity within seconds during exercise in a 39-year-old "
            "woman, followed by vomiting and a stiff neck. She has polycystic kidney disease. Temperature is normal.",
            "A 62-year-old smoker describes a headache that came on 'like being hit with a bat' an hour ago, with "
            "meningism and a third nerve palsy. Lumbar puncture twelve hours later shows xanthochromia.",
        ],
        "Giant cell arteritis": [
            "A 74-year-old woman has a new left temporal headache for three weeks, pain in her jaw when chewing "
            "and scalp tenderness when combing her hair. The temporal artery is thickened and tender; ESR is "
            "98 mm/h.",
            "A 69-year-old man with shoulder and hip girdle stiffness in the mornings now has a new headache, "
            "jaw claudication and an episode of transient monocular blindness. ESR and CRP are both high.",
            "New-onset headache in a 78-year-old with tenderness over a nodular, pulseless temporal artery, "
            "fatigue, weight loss and pain in the jaw on eating. Erythrocyte sedimentation rate is 110 mm/h.",
            "A 71-year-old woman reports scalp soreness, temple pain, and her jaw tiring while she eats. She had "
            "a brief curtain of vision loss in one eye yesterday. CRP is markedly raised.",
        ],
        "Cluster headache": [
            "A 32-year-old man who smokes has attacks of excruciating pain around his right eye lasting 45 minutes, "
            "with tearing, a red eye and a blocked, running nostril on that side. They wake him at the same hour "
            "each night for the last three weeks; he paces during attacks.",
            "Nightly bouts of severe unilateral orbital and temporal pain for 30 to 90 minutes in a 28-year-old man, "
            "with ipsilateral lacrimation, ptosis and rhinorrhoea; he cannot keep still. A similar period occurred "
            "a year ago.",
            "A 40-year-old man describes 'a hot poker in my eye' on the left side, lasting under an hour, once or "
            "twice a day for a month, with ipsilateral eye watering, nasal congestion and a small pupil.",
            "Short excruciating attacks behind one eye in a 36-year-old man, with a drooping eyelid, tearing and "
            "a runny nose on the same side, restlessness during the attack, clustered over several weeks each spring.",
        ],
        "Idiopathic intracranial hypertension": [
            "An obese 26-year-old woman has daily headaches worse in the morning and on bending, pulsatile "
            "whooshing in her ears and brief greying of vision on standing. Fundoscopy shows bilateral papilloedema; "
            "MRI of the brain is normal.",
            "A 30-year-old woman who has gained 15 kg over the last year reports headaches, transient visual "
            "obscurations and double vision from a sixth nerve palsy. Both optic discs are swollen; imaging shows "
            "no mass and the opening pressure is raised.",
            "Daily headache with pulsatile tinnitus in a 22-year-old overweight woman taking a tetracycline for "
            "acne. She has bilateral disc swelling, normal neurological examination otherwise, and normal brain "
            "imaging.",
            "A 34-year-old obese woman has had headaches for two months, worse lying down, with episodes of "
            "blurred vision lasting seconds. Papilloedema is seen on both sides; CT and MR venography are normal; "
            "lumbar puncture pressure is high with normal CSF.",
        ],
        "Bacterial meningitis": [
            "A 19-year-old university student has fever of 39.6 C, severe headache, neck stiffness and "
            "photophobia for 12 hours. He is drowsy and has a non-blanching petechial rash on his legs.",
            "A 67-year-old man presents with high fever, headache, confusion and a stiff neck. CSF is turbid with "
            "a neutrophil count of 2,400 cells/uL, low glucose and high protein; Gram stain shows diplococci.",
            "Fever, rigors, headache and nuchal rigidity in a 45-year-old woman with an ear infection, with "
            "positive Kernig and Brudzinski signs. Lumbar puncture: cloudy fluid, many neutrophils, glucose far "
            "below the serum level.",
            "A 22-year-old soldier in barracks becomes febrile and confused with a severe headache, neck stiffness "
            "and purpuric spots on his trunk. Blood pressure is falling.",
        ],
    },
    "pelvic pain": {
        "Ectopic pregnancy": [
            "A 27-year-old woman whose last period was seven weeks ago has lower abdominal pain on the right and "
            "light vaginal bleeding. Urine hCG is positive; transvaginal ultrasound shows an empty uterus and "
            "free fluid in the pouch of Douglas.",
            "A 31-year-old woman with a history of chlamydia and an IUD has sudden unilateral pelvic pain, shoulder "
            "tip pain and dizziness, six weeks after her last menstrual period. Serum beta-hCG is 2,800 IU/L "
            "and no intrauterine sac is seen.",
            "Amenorrhoea for eight weeks, spotting and sharp left iliac fossa pain in a 24-year-old woman who is "
            "now pale and hypotensive. Pregnancy test is positive and ultrasound shows an adnexal mass with "
            "haemoperitoneum.",
            "A 35-year-old woman after IVF treatment has pelvic pain and brown spotting; her hCG rose only slightly "
            "over 48 hours and the uterus is empty on ultrasound, with a tender adnexal mass.",
        ],
        "Ovarian torsion": [
            "A 23-year-old woman has sudden severe right-sided pelvic pain with nausea and vomiting that began "
            "while playing tennis. She has a known 6 cm ovarian cyst. Pregnancy test is negative; Doppler shows "
            "absent flow to an enlarged right ovary.",
            "Abrupt intermittent left lower abdominal pain with vomiting in a 16-year-old girl. Ultrasound shows "
            "an enlarged oedematous left ovary with peripheral follicles and reduced venous flow; hCG negative; "
            "afebrile.",
            "A 29-year-old woman undergoing ovarian stimulation develops sudden colicky unilateral pelvic pain "
            "with retching. The ovary is enlarged with a whirlpool sign on ultrasound. She is not pregnant.",
            "Sudden sharp right adnexal pain radiating to the groin, with vomiting, in a 32-year-old woman with a "
            "dermoid cyst. Urine hCG is negative; the enlarged ovary has no arterial Doppler signal.",
        ],
        "Acute appendicitis": [
            "A 21-year-old woman has periumbilical pain for a day that has moved to the right iliac fossa, with "
            "anorexia, one episode of vomiting and a low-grade fever. There is rebound tenderness at McBurney's "
            "point. Pregnancy test is negative.",
            "Pain that started around the navel and migrated to the right lower quadrant over 18 hours in a "
            "26-year-old woman, with loss of appetite and guarding. Rovsing and psoas signs are positive; white "
            "count is 15,000; hCG negative.",
            "A 19-year-old woman has right lower abdominal pain worse on coughing and walking, preceded by vague "
            "central pain and nausea. Temperature is 37.9 C, there is localised rebound in the right iliac fossa, "
            "and pelvic examination is normal.",
            "A 30-year-old woman with central abdominal pain that shifted to the right iliac fossa, anorexia and "
            "fever. Ultrasound shows a non-compressible tubular structure 9 mm wide in the right lower quadrant; "
            "the ovaries are normal.",
        ],
        "Pelvic inflammatory disease": [
            "A 22-year-old sexually active woman with a new partner has bilateral lower abdominal pain, fever and "
            "purulent vaginal discharge. She has cervical motion tenderness and bilateral adnexal tenderness. "
            "Pregnancy test is negative.",
            "Bilateral pelvic pain for four days after her period in a 25-year-old woman, with dyspareunia, "
            "fever of 38.4 C and mucopurulent cervical discharge. Moving the cervix is very painful; NAAT is "
            "positive for gonorrhoea.",
            "A 19-year-old woman with several recent sexual partners has lower abdominal pain on both sides, "
            "vaginal discharge and intermenstrual bleeding. Examination shows cervical excitation and tender "
            "adnexa; hCG negative; right upper quadrant pain suggests perihepatitis.",
            "Fever, bilateral adnexal tenderness and cervical motion tenderness in a 28-year-old woman with an "
            "untreated chlamydia infection; she has pain during intercourse and a foul discharge. hCG is negative.",
        ],
    },
}

EXTRA = {"chest pain": "Cluster headache", "headache": "Pelvic inflammatory disease", "pelvic pain": "Acute pericarditis"}
"""One option from another group per case, so options are not only the group's own diagnoses."""

QUESTION = " Which of the following is the most likely diagnosis?"


def _rank(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def cases(variants: tuple[int, ...]) -> list[dict]:
    """The cases of the given variants (0-based), interleaved deterministically (a fixed hash order)."""
    out = []
    for group, diagnoses in GROUPS.items():
        choices = [d for d in diagnoses if d != EXTRA.get(group)][:4] + [EXTRA[group]]
        for dx, texts in diagnoses.items():
            pool = choices if dx in choices else choices[:3] + [dx, EXTRA[group]]
            for v in variants:
                order = sorted(pool, key=lambda o: _rank(dx, str(v), o))
                options = {chr(65 + i): o for i, o in enumerate(order)}
                answer = next(k for k, o in options.items() if o == dx)
                slug = "".join(ch for ch in dx.lower() if ch.isalnum())[:10]
                out.append({"case_id": f"rec-{slug}-{v + 1}", "kind": "mcq", "question": texts[v] + QUESTION,
                            "options": options, "answer": answer, "category": group})
    # interleave: first every diagnosis' first variant in a hashed order, then the second ones
    return sorted(out, key=lambda c: (c["case_id"][-1], _rank(c["case_id"])))


def write(out_dir: str) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, variants in (("recurring_train.jsonl", (0, 1)), ("recurring_test.jsonl", (2, 3))):
        path = os.path.join(out_dir, name)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            for c in cases(variants):
                f.write(json.dumps(c, sort_keys=True) + "\n")
        os.replace(tmp, path)
        paths.append(path)
    return paths[0], paths[1]


if __name__ == "__main__":
    print(*write(sys.argv[1] if len(sys.argv) > 1 else "examples"))
