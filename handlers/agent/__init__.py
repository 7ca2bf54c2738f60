"""The ReAct agent loop used by model backbones: protocol parsing, context guard, the loop."""
