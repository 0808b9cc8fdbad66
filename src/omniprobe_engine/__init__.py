"""The engine side of omniprobe: what runs in the runner's own interpreter, apart from the harness.

- runner.py: the offline runner's loop (requests, or a capacity search) and its command line;
- protocol.py: every message between the harness and the runner, declared once;
- search.py: the capacity search's rule (a bisection over pool limits, as a band);
- omni.py: vLLM-Omni's offline engine; diffusers_engine.py, diffusers_build.py and adapters/:
  the Diffusers engine, its streamed random build and one adapter per model family;
- emulation_site/: the startup hook that caps an emulated server's or runner's torch;
- cgroup_exec.py: joins a host-RAM cgroup, then becomes the runner;
- launch.py: the folder an interpreter runs as the runner, with this package and nothing else.

It imports nothing of omniprobe, and only the standard library at import time (torch, diffusers
and vllm_omni when an engine is built); tests/test_architecture.py holds both.
"""
