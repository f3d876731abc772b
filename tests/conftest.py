import torch
from hypothesis import settings

torch.set_num_threads(1)
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)  # reproducible in CI
settings.load_profile("ci")
