"""The emulation startup hook's folder: put on an emulated server's PYTHONPATH."""
