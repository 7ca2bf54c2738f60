"""RetroSum (AgentEHR, seed 002): the experience bank of actor and summariser lessons."""
