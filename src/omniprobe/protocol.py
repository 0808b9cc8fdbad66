"""What the harness says to vLLM-Omni and reads back, declared once as data: the routes and form
fields of its requests, the log line that says a deploy config was ignored, and the offline
runner's calls into `Omni`.

The harness's client and log reader take theirs from here; the offline runner's Omni engine,
which stands alone in the probe venv, declares its calls in omniprobe_engine/protocol.py, named
here too. The upstream checks (upstream/checks.py) hold this against upstream's code, so a
change on either side shows. Standard library only, and nothing of omniprobe: every floor may
read it.
"""

from __future__ import annotations

from omniprobe_engine import protocol as engine_protocol

# --- the HTTP client (harness/serve/client.py) ----------------------------------------------------

EDITS_PATH = "/v1/images/edits"
GENERATIONS_PATH = "/v1/images/generations"
IMAGE_PART = "image"  # one multipart part of this name per reference image
# The form fields of every request, in the order the client sends them (client.form_fields).
FORM_FIELDS = ("prompt", "size", "seed", "num_inference_steps", "true_cfg_scale",
               "response_format", "return_stage_metrics")

# --- the server's log (harness/common/logs.py) -----------------------------------------------------

# Upstream's warning when --deploy-config is accepted and then ignored: a single-stage diffusion
# model without a registered pipeline config gets the default stage, built from CLI arguments.
DEPLOY_IGNORED_WARNING = "No registered PipelineConfig resolved for model"

# --- the offline runner's Omni engine (omniprobe_engine/omni.py) ---------------------------

# The keywords it passes OmniDiffusionSamplingParams, and the request output's field it reads the
# diffusion worker's peak from: the engine's protocol declares both.
SAMPLING_PARAMS = engine_protocol.SAMPLING_PARAMS
OUTPUT_PEAK = engine_protocol.OUTPUT_PEAK
# A failed `Omni.generate` ends the runner (run: an engine that does not survive failures).
ENDS_AT_A_FAILED_REQUEST = True
# References go to the pipeline in their files' modes, never converted to RGB (open_reference).
REFERENCES_TO_RGB = False
