# Transcribed from MedAgentBench src/server/tasks/medagentbench/utils.py (upstream 99260117137b), MIT,
# Copyright (c) 2025 Stanford Machine Learning Group (see LICENSE.MIT). Unchanged apart from this header.
import requests

def verify_fhir_server(fhir_api_base):
    """
    Verify connection to FHIR server. Returns True if everything is good
    """
    res = send_get_request(f'{fhir_api_base}metadata')
    if res.get('status_code', 0) != 200:
        return False
    return True

def send_get_request(url, params=None, headers=None):
    try:
        response = requests.get(url, params=params, headers=headers)
        response.raise_for_status()  # Raises an HTTPError if the response code is 4xx or 5xx
        return {
            "status_code": response.status_code,
            "data": response.json() if response.headers.get('Content-Type') == 'application/json' else response.text
        }
    except Exception as e:
        return {"error": str(e)}
