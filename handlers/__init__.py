"""The five stages (retrieve, act, feedback, reflect, govern) and the memory policies they apply."""
