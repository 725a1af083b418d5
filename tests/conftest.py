import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

# Two cores shared with other work: one intra-op thread keeps the torch paths fast and stable.
torch.set_num_threads(1)

settings.register_profile("default", deadline=None, max_examples=50)
settings.register_profile("deep", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
