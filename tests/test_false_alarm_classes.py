"""The classes of false findings that triage on real projects found, each with variants written
for it: amplint stays silent by default where the code shows no mistake, and a close variant
that has one is still reported. Real parses (``check_source``) and, where other files matter,
projects on disk through the real CLI."""

import json
import textwrap

import pytest

from amplint import check_source


def _codes(code: str, preview: bool = False) -> list[tuple[int, str]]:
    result = check_source(textwrap.dedent(code), preview=preview)
    return [(d.location.row, d.code) for d in result]


# 1. Half precision guessed, not shown: the value meeting float32 (or the epsilon) is not
# shown half by an op autocast lowers.
@pytest.mark.parametrize("code", [
    # a data-loader batch: float32 from the loader, whatever the region does to the model
    """
    import torch

    def pad_targets(model, loader, optimizer, scaler):
        for images, targets in loader:
            with torch.autocast("cuda"):
                logits = model(images)
            padded = torch.zeros(images.shape[0], 100, device=images.device)
            padded[:, : targets.shape[1]] = targets
            loss = torch.nn.functional.mse_loss(logits.float(), padded)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    """,
    # complex: an FFT's result, then its magnitude
    """
    import torch

    def spectrum(x):
        with torch.autocast("cuda"):
            freq = torch.fft.rfft(x.float())
        mag = freq.abs()
        return mag / (mag.sum() + 1e-8)
    """,
    # moved to the CPU and made float32 before it meets anything
    """
    import torch

    def collect(model, batch):
        with torch.autocast("cuda"):
            out = model(batch)
        scores = out.detach().cpu().float()
        table = torch.zeros(scores.shape[0], 10)
        table[:, :5] = scores[:, :5]
        return table / (table.sum(1, keepdim=True) + 1e-10)
    """,
    # a 0-dim float32 accumulator plus a float32 sum stays float32 inside the region
    """
    import torch

    def normalize(model, x):
        with torch.autocast("cuda"):
            h = model(x)
            total = torch.tensor(0.0, device=h.device)
            total = total + h.float().sum()
            return h.float() / (total + 1e-9)
    """,
    # a full reduction autocast runs in float32
    """
    import torch

    def attend(q, k):
        with torch.autocast("cuda"):
            scores = q @ k.t()
            return scores / (scores.sum() + 1e-9)
    """,
])
def test_half_that_is_guessed_is_not_reported(code):
    assert _codes(code) == []


def test_half_that_an_op_shows_is_reported():
    # `q @ k.t()` is float16 under CUDA autocast; a Python number does not promote it
    assert _codes("""
    import torch

    def attend_rows(q, k):
        with torch.autocast("cuda"):
            scores = q @ k.t()
            scaled = scores * 0.5
            return scaled / (scaled + 1e-9)
    """) == [(8, "AMP018")]


# 2. Two bindings of one name taken for one.
def test_a_name_rebound_in_a_loop_is_read_with_the_binding_that_reaches_it():
    silent = """
    import torch

    def run(model, loader):
        stats = None
        for batch in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                stats = model.encode(batch) @ model.proj
            stats = stats.float()
            eps = stats / (stats + 1e-9)
        return eps
    """
    assert _codes(silent) == []
    # without the rebinding the product reaches the epsilon in float16
    assert _codes("""
    import torch

    def run(model, loader):
        stats = None
        for batch in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                stats = model.encode(batch) @ model.proj
                eps = stats / (stats + 1e-9)
        return eps
    """) == [(9, "AMP018")]


def test_an_augmented_assignment_is_a_binding_of_its_own():
    # `total += 1` after a float32 assignment: what `total` holds is not shown by an assignment
    # alone, so nothing is claimed from it (neither half nor float32)
    code = """
    import torch

    def f(q, k):
        with torch.autocast("cuda"):
            total = q @ k.t()
            total += 1
            return total / (total + 1e-9)
    """
    assert _codes(code) == [(8, "AMP018")]  # unknown inside the region: the region's dtype


# 3. Paths that cannot run: one condition, unchanged, taken both ways.
@pytest.mark.parametrize("code", [
    """
    import torch

    def train(model, loader, optimizer, accum=1, amp=False):
        scaler = torch.amp.GradScaler("cuda", enabled=amp)
        for i, batch in enumerate(loader):
            with torch.autocast("cuda", enabled=amp):
                loss = model(batch).mean()
            scaler.scale(loss / accum).backward()
            if accum > 1 and (i + 1) % accum != 0:
                continue
            if accum > 1:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    """,
    """
    import torch

    def train(gen, disc, loader, opt_g, opt_d, amp):
        if amp:
            scaler_g = torch.amp.GradScaler("cuda")
            scaler_d = torch.amp.GradScaler("cuda")
        for batch in loader:
            with torch.autocast("cuda", enabled=amp):
                g_loss = gen(batch).mean()
                d_loss = disc(batch).mean()
            if amp:
                scaler_g.scale(g_loss).backward()
                scaler_g.step(opt_g)
                scaler_g.update()
                scaler_d.scale(d_loss).backward()
                scaler_d.step(opt_d)
                scaler_d.update()
            else:
                g_loss.backward()
                opt_g.step()
                d_loss.backward()
                opt_d.step()
    """,
])
def test_paths_that_cannot_run_are_not_followed(code):
    assert _codes(code, preview=True) == []


def test_a_path_that_can_run_is_followed():
    # the clip sits under a condition of its own: the unscale may not have happened
    assert _codes("""
    import torch

    def train(model, loader, optimizer, clip=0.0, amp=True):
        scaler = torch.amp.GradScaler("cuda", enabled=amp)
        for batch in loader:
            with torch.autocast("cuda", enabled=amp):
                loss = model(batch).mean()
            scaler.scale(loss).backward()
            if clip > 0 and amp:
                scaler.unscale_(optimizer)
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
    """) == [(13, "AMP002")]


# 4. Regions that are off on every run the project shows.
HEAD = """\
import torch


class Head(torch.nn.Module):
    def __init__(self, width, use_amp=False):
        super().__init__()
        self.use_amp = use_amp
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        with torch.autocast("cuda", enabled=self.use_amp):
            return self._normalize(self.fc(x))

    def _normalize(self, h):
        scores = h @ h.t()
        return scores / (scores + 1e-9)
"""


@pytest.mark.parametrize("other,expected", [
    ("from head import Head\nhead = Head(8)\n", []),  # nothing turns it on
    ("from head import Head\nhead = Head(8, use_amp=cfg.amp)\n", [(16, "AMP018")]),  # a call passes it
    ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--use-amp', action='store_true')\n",
     [(16, "AMP018")]),  # a flag of its name
])
def test_a_region_switched_by_a_parameter_nothing_passes_is_off(tmp_path, run_amplint, other, expected):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'heads'\n")
    (tmp_path / "head.py").write_text(HEAD)
    (tmp_path / "main.py").write_text(other)
    result = run_amplint("check", "--no-cache", "--output-format", "json", "head.py", cwd=tmp_path)
    assert [(f["location"]["row"], f["code"]) for f in json.loads(result.stdout)] == expected


def test_a_region_switched_by_a_parameter_the_file_passes_positionally_is_on():
    assert _codes(HEAD + "\nhead = Head(8, True)\n") == [(16, "AMP018")]


# 5. Gates in other methods: made half only on the evaluation path, trained on the other.
def test_a_model_made_half_only_where_it_is_not_trained():
    code = """
    import torch

    class Runner:
        def __init__(self, model, mode):
            self.model = model
            if mode == "train":
                self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            else:
                self.model = self.model.half().eval()

        def step(self, batch):
            loss = self.model(batch).mean()
            loss.backward()
            self.optimizer.step()
    """
    assert _codes(code) == []
    # half on the path that builds the optimizer: trained in float16 without float32 master weights
    assert _codes(code.replace("""
                self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            else:
                self.model = self.model.half().eval()
""", """
                self.model = self.model.half()
                self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
""")) == [(9, "AMP016")]
