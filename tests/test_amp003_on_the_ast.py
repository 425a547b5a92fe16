"""AMP003 on Python's ``ast``, through the real CLI on projects written to disk: a float32 tensor
(a factory given a device and no ``dtype=``, or ``.float()`` of integers) found where it meets
the activations (a concatenation, a sum, an index-put, a scatter, an RNN's state, a matmul, a
module made half), following names through the engine's bindings (an unpacking, ``+=``, a list
built with ``append``, a helper's parameter with what the file passes for it), with its fix as
a text edit; and silent where the other value is float32 too or the tensor gets a dtype."""

import json

import pytest
from click.testing import CliRunner

from amplint.cli import main
from projects import findings, write_files


def fixes(root, monkeypatch) -> dict[int, str]:
    """The fixed text of each AMP003 finding with a fix, by its row."""
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, ["check", "--select", "AMP003", "--preview", "--output-format", "json",
                                       "--no-cache", "."])
    assert result.exit_code in (0, 1), result.output
    return {f["location"]["row"]: f["fix"]["edits"][0]["content"] for f in json.loads(result.output) if f["fix"]}


def found(tmp_path, monkeypatch, files: dict[str, str]) -> list[tuple]:
    return findings(write_files(tmp_path, files), "AMP003", monkeypatch, "--preview")


@pytest.mark.parametrize("code,row,part", [
    # A padding column concatenated with the hidden states of a decoder layer.
    ('''
     import torch
     from torch import nn

     class PaddedDecoder(nn.Module):
         def forward(self, hidden):
             pad = torch.zeros(hidden.shape[0], 1, hidden.shape[2], device=hidden.device)
             return self.out(torch.cat([hidden, pad], dim=1))
     ''', 7, "line 8 concatenates it with `hidden`"),
    # A position table added to the embeddings, updated in place first (`+=` keeps the tensor).
    ('''
     import torch
     from torch import nn

     class Embedder(nn.Module):
         def forward(self, tokens):
             emb = self.embed(tokens)
             table = torch.ones(emb.shape[1], emb.shape[2], device=emb.device)
             table += self.offset
             return emb + table
     ''', 8, "line 10 adds it to `emb`"),
    # A list of head outputs built with `append`, concatenated with a float32 bias column.
    ('''
     import torch
     from torch import nn

     class MultiHead(nn.Module):
         def forward(self, x):
             outs = []
             for head in self.heads:
                 outs.append(head(x))
             bias = torch.ones(x.shape[0], 1, device=x.device)
             return torch.cat(outs + [bias], dim=-1), torch.stack([torch.cat(outs, -1), bias.expand(-1, 4)])
     ''', 10, "concatenates it with `torch.cat(outs, -1)`"),
])
def test_a_factory_meeting_the_activations_is_found(tmp_path, monkeypatch, code, row, part):
    (result,) = found(tmp_path, monkeypatch, {"pyproject.toml": "", "model.py": code})
    assert result[0] == "model.py" and result[1] == row
    assert "without `dtype=` makes a float32 tensor" in result[2] and part in result[2]


@pytest.mark.parametrize("code", [
    # The same padding with the hidden states' dtype, or cast before it meets them.
    '''
    import torch
    from torch import nn

    class PaddedDecoder(nn.Module):
        def forward(self, hidden):
            pad = torch.zeros(hidden.shape[0], 1, device=hidden.device, dtype=hidden.dtype)
            pos = torch.ones(hidden.shape[0], 1, device=hidden.device).to(hidden.dtype)
            return torch.cat([hidden, pad, pos], dim=1)
    ''',
    # A float32 table met with what autocast runs in float32 (a softmax), and a 0-dim scale.
    '''
    import torch
    from torch import nn

    class Scorer(nn.Module):
        def forward(self, logits):
            probs = logits.softmax(dim=-1)
            prior = torch.full((logits.shape[-1],), 0.5, device=logits.device)
            scale = torch.tensor(2.0, device=logits.device)
            return probs * prior, logits * scale
    ''',
    # `state` is rebound later in the loop around the read: the read has no one value there
    # (`regions.value_before`), and what it may hold is not guessed.
    '''
    import torch
    from torch import nn

    class Refiner(nn.Module):
        def forward(self, features):
            state = features[:, :4]
            for _ in range(3):
                update = torch.empty(features.shape[0], 4, device=features.device)
                gap = update - state
                state = update
            return state
    ''',
])
def test_silent_where_the_dtypes_agree_or_are_not_shown(tmp_path, monkeypatch, code):
    assert found(tmp_path, monkeypatch, {"pyproject.toml": "", "model.py": code}) == []


def test_index_puts_and_scatters(tmp_path, monkeypatch):
    write_files(tmp_path, {"pyproject.toml": "", "pool.py": '''
        import torch

        def scatter_scores(scores, row_idx, n):
            scores = scores.half()
            full = torch.zeros(scores.shape[0], n, device=scores.device)
            full[row_idx] = scores
            return full

        def class_totals(logits, labels, num_classes):
            hits = logits.argmax(-1).eq(labels)
            totals = logits.new_zeros(num_classes)
            totals.index_add_(0, labels, hits.float())
            return totals

        def copy_rows(hidden, n):
            out = torch.zeros(n, hidden.shape[-1], device=hidden.device)
            out[0] = hidden[0]  # a copy into a slice casts
            return out
        '''})
    results = findings(tmp_path, "AMP003", monkeypatch, "--preview")
    assert [(r[0], r[1]) for r in results] == [("pool.py", 6), ("pool.py", 13)]
    assert "line 7 index-puts `scores` into it" in results[0][2]
    assert "`hits.float()` makes a float32 tensor, and line 13 `index_add_`s it into `totals`" in results[1][2]
    assert fixes(tmp_path, monkeypatch) == {
        6: "scores.new_zeros(scores.shape[0], n)",
        13: "hits.to(totals.dtype)"}


def test_a_recurrent_state_and_a_module_made_half(tmp_path, monkeypatch):
    write_files(tmp_path, {"pyproject.toml": "", "encoder.py": '''
        import torch
        from torch import nn

        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.gru = nn.GRU(16, 32, batch_first=True)

            def forward(self, frames):
                h0 = torch.zeros(1, frames.size(0), 32, device=frames.device)
                return self.gru(frames, h0)

        encoder = Encoder().cuda()
        encoder.half()

        def encode(batch):
            lengths = batch["lengths"] > 0
            return encoder(torch.randn(lengths.shape[0], 8, 16, device="cuda"), lengths.float())
        '''})
    results = findings(tmp_path, "AMP003", monkeypatch, "--preview")
    assert [(r[0], r[1]) for r in results] == [("encoder.py", 11), ("encoder.py", 19), ("encoder.py", 19)]
    assert "line 12 passes it to `self.gru` as the state of `frames`" in results[0][2]
    assert "`torch.randn` without `dtype=` makes a float32 tensor, and line 19 passes it to `encoder`, made half " \
        "on line 15" in results[1][2]
    assert "`lengths.float()` makes a float32 tensor" in results[2][2]


def test_a_helper_takes_what_its_callers_pass(tmp_path, monkeypatch):
    """A method's tensor parameter is an activation, unless every call in the file passes
    float32 values."""
    write_files(tmp_path, {"pyproject.toml": "", "heads.py": '''
        import torch
        from torch import nn

        class Head(nn.Module):
            def forward(self, x):
                return self.with_bias(x.float()), self.with_bias(torch.rand(3, 4, device=x.device))

            def with_bias(self, values):
                bias = torch.ones(values.shape[0], 1, device=values.device)
                return torch.cat([values, bias], dim=1)

        class Tail(nn.Module):
            def forward(self, x):
                return self.pad(self.proj(x))

            def pad(self, values):
                bias = torch.ones(values.shape[0], 1, device=values.device)
                return torch.cat([values, bias], dim=1)
        '''})
    results = findings(tmp_path, "AMP003", monkeypatch, "--preview")
    assert [(r[0], r[1]) for r in results] == [("heads.py", 18)]
    assert "line 19 concatenates it with `values`" in results[0][2]


def test_a_region_around_the_caller_is_named(tmp_path, monkeypatch):
    """Reported without --preview where the autocast region around a caller in the file shows
    the value is half, with that call as a related location."""
    root = write_files(tmp_path, {"pyproject.toml": "", "step.py": '''
        import torch
        import torch.nn.functional as F

        def scatter_logits(x, w, row_idx, n):
            logits = F.linear(x, w)
            table = torch.zeros(n, logits.shape[-1], device=logits.device)
            table[row_idx] = logits
            return table

        def train_step(x, w, row_idx, n):
            with torch.autocast("cuda"):
                return scatter_logits(x, w, row_idx, n)
        '''})
    (result,) = findings(root, "AMP003", monkeypatch)
    assert result[:2] == ("step.py", 7)
    assert "line 8 index-puts `logits` into it" in result[2]
    assert "(this runs under the autocast of line 12, through the call on line 13)" in result[2]
    assert result[3] == [("step.py", 13, "runs it under autocast")]


@pytest.mark.parametrize("autocast,expected", [(True, 1), (False, 0)])
def test_a_loss_model_under_the_project_autocast(tmp_path, monkeypatch, autocast, expected):
    trainer = '''
        import torch

        def fit_step(criterion, optimizer, scaler, batch):
            with torch.autocast("cuda"):
                loss = criterion(*batch)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        ''' if autocast else '''
        def fit_step(criterion, optimizer, batch):
            loss = criterion(*batch)
            loss.backward()
            optimizer.step()
        '''
    root = write_files(tmp_path, {"pyproject.toml": "", "train/trainer.py": trainer, "train/ranking.py": '''
        import torch
        from torch import nn

        class PairwiseRankingLoss(nn.Module):
            def forward(self, queries: list[str], slots, row_idx, col_idx):
                scores = self.scorer(self.tokenizer(queries))["logits"].flatten()
                table = torch.full((slots, 16), -1e4, device=self.scorer.device)
                table[row_idx, col_idx] = scores
                return table.log_softmax(dim=-1)
        '''})
    results = findings(root, "AMP003", monkeypatch, "--preview")
    assert len(results) == expected
    if autocast:
        assert results[0][:2] == ("train/ranking.py", 8)
        assert "index-puts `scores` into it, which is float16/bfloat16 when `PairwiseRankingLoss.forward` runs " \
            "under the autocast this project enables (train/trainer.py:5)" in results[0][2]
        assert results[0][3] == [("train/trainer.py", 5, "autocast entered here")]


def test_the_fix_keeps_the_call_as_written(tmp_path, monkeypatch):
    """The fix is a text edit: the call's other lines keep their indentation and comments."""
    write_files(tmp_path, {"pyproject.toml": "", "mixer.py": '''
        import torch
        from torch import nn

        class Mixer(nn.Module):
            def forward(self, x, noise_level):
                if noise_level:
                    noise = torch.randn(
                        x.shape[0],
                        x.shape[1],  # channels
                        device=x.device,
                    )
                    extra = torch.rand(
                        x.shape[0], 1,
                        device=noise_level.device
                    )
                    return x + noise, torch.cat([x, extra], dim=1)
                return x
        '''})
    assert fixes(tmp_path, monkeypatch) == {
        8: "torch.randn(\n                x.shape[0],\n                x.shape[1],  # channels\n"
           "                device=x.device, dtype=x.dtype,\n            )",
        13: "torch.rand(\n                x.shape[0], 1,\n                device=noise_level.device, \n"
            "            dtype=x.dtype)"}


def test_an_index_bound_to_a_tuple(tmp_path, monkeypatch):
    """A tuple index is an index-put where one of its indices is a tensor; a tuple of slices
    copies into a slice, which casts."""
    write_files(tmp_path, {"pyproject.toml": "", "spectral.py": '''
        import torch
        from torch import nn

        class SpectralMix(nn.Module):
            def forward(self, x, modes):
                out = torch.zeros(x.shape[0], x.shape[1], 8, device=x.device)
                low = (slice(None), slice(0, modes))
                out[low] = self.mix(x[low])
                picked = torch.zeros(x.shape[0], 8, device=x.device)
                rows = (torch.arange(x.shape[0]), self.top_k(x))
                picked[rows] = self.gate(x)
                return out, picked
        '''})
    results = findings(tmp_path, "AMP003", monkeypatch, "--preview")
    assert [(r[0], r[1]) for r in results] == [("spectral.py", 10)]
    assert "line 12 index-puts `self.gate(x)` into it" in results[0][2]


def test_outside_preview_a_finding_needs_its_half_value_shown_in_the_file(tmp_path, monkeypatch):
    """Without ``--preview``, a float32 tensor is reported only where the file shows what makes
    the other value half: an autocast region or a half producer. An activation alone (a module's forward, no region) is a preview finding,
    and the prefilter leaves such files unparsed."""
    root = write_files(tmp_path, {
        "pyproject.toml": "[project]\nname = 'seg'\n",
        "seg/__init__.py": "",
        "seg/head.py": """
            import torch
            from torch import nn

            class Head(nn.Module):
                def forward(self, feats, w):
                    with torch.autocast("cuda"):
                        logits = feats @ w
                        bias = torch.ones(logits.shape[0], 1, device=logits.device)
                        return torch.cat([logits, bias], dim=1)
            """,
        "seg/pool.py": """
            import torch
            from torch import nn

            class Pool(nn.Module):
                def forward(self, hidden):
                    pad = torch.zeros(hidden.shape[0], 1, hidden.shape[2], device=hidden.device)
                    return torch.cat([hidden, pad], dim=1)
            """,
    })
    default = findings(root, "AMP003", monkeypatch)
    assert [(path, row) for path, row, *_ in default] == [("seg/head.py", 9)]
    assert "line 10 concatenates it with `logits`" in default[0][2]
    preview = findings(root, "AMP003", monkeypatch, "--preview")
    assert [(path, row) for path, row, *_ in preview] == [("seg/head.py", 9), ("seg/pool.py", 7)]
