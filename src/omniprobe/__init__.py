"""omniprobe: reproducible probes of a model-serving stack on a given GPU, and their report."""

__version__ = "0.1.0"
