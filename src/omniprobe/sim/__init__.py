"""A simulated vLLM-Omni image server: the real CLI shape and HTTP API over a capacity model.

Everything it produces is simulated and is filed only under simulated hosts.
"""
