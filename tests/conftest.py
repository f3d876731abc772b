import torch
from hypothesis import settings

torch.set_num_threads(1)
settings.register_profile("ci", max_examples=40, deadline=None)
settings.load_profile("ci")
