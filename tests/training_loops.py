"""Training loops assembled from random correct and faulty snippets (hypothesis), shared by the
fuzz test (any combination must lint cleanly) and the differential test and benchmark (each loop
run on the CPU under `amplint trace` and linted by `amplint check`).

``training_loops()`` draws the fuzz test's loops (CUDA regions and scalers, names left unbound);
``training_loops(regions=CPU_REGIONS, setup=CPU_SETUP, imports=[CPU_IMPORT], call_function=True)``
draws loops that run on this machine after ``CPU_PRELUDE`` (which binds every name they use)."""

from __future__ import annotations

import textwrap

from hypothesis import strategies as st

IMPORTS = [
    "import torch",
    "import torch as th\nimport torch",
    "import torch\nfrom torch.cuda.amp import autocast, GradScaler",
    "import torch\nfrom torch.cuda import amp",
    "import torch\nimport torch.nn.functional as F\nfrom torch import nn",
]
REGIONS = [
    'with torch.autocast("cuda"):',
    'with torch.autocast("cuda", dtype=torch.bfloat16):',
    "with torch.cuda.amp.autocast():",
    'with torch.autocast("cuda", enabled=False):',
    'with torch.autocast("cpu", dtype=torch.float64):',
]
INSIDE = [
    "out = model(x)",
    "loss = loss_fn(out, y)",
    "loss = torch.nn.functional.binary_cross_entropy(torch.sigmoid(out), y)",
    "logp = torch.log(torch.softmax(out, dim=-1))",
    "pad = torch.zeros(out.shape[0], 1, device=out.device)",
    "loss = out.mean() / (out.abs().amax() + 1e-8)",
    "scaler.scale(loss).backward()",
    "loss.backward()",
]
AFTER = [
    "scaler.scale(loss).backward()",
    "loss.backward()",
    "scaler.unscale_(optimizer)",
    "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "scaler.step(optimizer)",
    "optimizer.step()",
    "scaler.update()",
    "optimizer.zero_grad()",
    "if max_norm:\n    scaler.unscale_(optimizer)\n    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
    'torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)',
]
SETUP = [
    "scaler = torch.cuda.amp.GradScaler()",
    'scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)',
    "scaler = torch.cuda.amp.GradScaler(2.0**14, enabled=True)",
]

# The same snippets on the CPU, whose autocast runs here: the CUDA-only spellings (regions and
# scalers that disable themselves without a GPU) are replaced by their CPU forms.
CPU_IMPORT = "import torch"
CPU_REGIONS = [
    'with torch.autocast("cpu"):',
    'with torch.autocast("cpu", dtype=torch.bfloat16):',
    'with torch.autocast("cpu", dtype=torch.float16):',
    'with torch.autocast("cpu", enabled=False):',
    'with torch.autocast("cpu", dtype=torch.float64):',
]
CPU_SETUP = [
    'scaler = torch.amp.GradScaler("cpu")',
    'scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)',
    'scaler = torch.amp.GradScaler("cpu", 2.0**14, enabled=True)',
]
# Binds every name the snippets use: a model whose output suits both losses, a small loader.
CPU_PRELUDE = """\
import os
import tempfile
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1), torch.nn.Sigmoid())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = [(torch.randn(4, 8), torch.rand(4, 1)) for _ in range(3)]
x, y = loader[0]
loss_fn = torch.nn.MSELoss()
out = model(x)  # the snippets are drawn independently: one may use `out` or `loss` before making it
loss = loss_fn(out, y)
max_norm = 1.0
path = os.path.join(tempfile.gettempdir(), "amplint-differential.pt")
"""
FUNCTION_CALL = "train_step(model, x, y, optimizer, scaler, max_norm, path)"


@st.composite
def training_loops(draw, imports=IMPORTS, regions=REGIONS, setup=SETUP, call_function=False):
    """A loop: a region with 1-5 snippets inside, 0-7 after it, as a script, in a `for` over
    ``loader`` or in a function (called at the end when ``call_function``)."""
    body = [draw(st.sampled_from(regions))]
    body += ["    " + line for line in draw(st.lists(st.sampled_from(INSIDE), min_size=1, max_size=5))]
    body += draw(st.lists(st.sampled_from(AFTER), max_size=7))
    loop = "\n".join(body)
    wrapped = draw(st.sampled_from(["loop", "function", "module"]))
    if wrapped == "loop":
        loop = "for x, y in loader:\n" + textwrap.indent(loop, "    ")
    elif wrapped == "function":
        loop = "def train_step(model, x, y, optimizer, scaler, max_norm, path):\n" + textwrap.indent(loop, "    ")
        if call_function:
            loop += "\n\n\n" + FUNCTION_CALL
    return f"{draw(st.sampled_from(imports))}\n{draw(st.sampled_from(setup))}\n{loop}\n"
