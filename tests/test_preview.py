"""The preview tier: rules, and paths of rules, whose triaged precision (benchmarks/triage) is
below 0.9 report only with --preview or `preview = true`, through the real CLI."""

import json
import textwrap

from conftest import ROOT

# A half-only-under-autocast value met by a float32 factory in a model's forward, no region in
# the file (AMP003's preview path), and the same meeting inside an autocast region (its
# default path); a log of a softmax (AMP013, a preview rule).
CODE = textwrap.dedent("""\
    import torch
    from torch import nn


    class Head(nn.Module):
        def forward(self, x):
            pad = torch.zeros(x.shape[0], 1, device=x.device)
            return torch.cat([pad, self.proj(x)], dim=1)


    def step(model, x):
        with torch.autocast("cuda"):
            h = model(x)
            pad = torch.zeros(h.shape[0], 1, device=h.device)
            out = torch.cat([pad, h @ h.T], dim=1)
        return torch.log(torch.softmax(out, dim=-1))
""")


def _codes(run_amplint, cwd, *args):
    result = run_amplint("check", "--no-cache", "--output-format", "json", *args, "m.py", cwd=cwd)
    assert result.returncode in (0, 1), result.stderr
    return sorted((d["location"]["row"], d["code"]) for d in json.loads(result.stdout))


def test_preview_paths_and_rules_report_only_in_preview_mode(tmp_path, run_amplint):
    (tmp_path / "m.py").write_text(CODE)
    assert _codes(run_amplint, tmp_path) == [(14, "AMP003")]
    assert _codes(run_amplint, tmp_path, "--preview") == [(7, "AMP003"), (14, "AMP003"), (16, "AMP013")]
    # A preview rule selected by its code still needs preview mode.
    assert _codes(run_amplint, tmp_path, "--select", "AMP013") == []


def test_the_configuration_turns_preview_on_and_the_command_line_off(tmp_path, run_amplint):
    (tmp_path / "m.py").write_text(CODE)
    (tmp_path / "pyproject.toml").write_text("[tool.amplint]\npreview = true\n")
    assert _codes(run_amplint, tmp_path) == [(7, "AMP003"), (14, "AMP003"), (16, "AMP013")]
    assert _codes(run_amplint, tmp_path, "--no-preview") == [(14, "AMP003")]
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\npreview = "yes"\n')
    bad = run_amplint("check", "m.py", cwd=tmp_path)
    assert bad.returncode == 2 and "'preview' must be true or false" in bad.stderr


def test_every_rule_page_says_where_it_runs(run_amplint):
    page = (ROOT / "docs" / "rules.md").read_text()
    assert "Preview: runs only with `--preview`" in run_amplint("rule", "AMP013").stdout
    assert "only with `--preview`" in run_amplint("rule", "AMP018").stdout
    assert "| [AMP013](#amp013-log-of-softmax) | log-of-softmax | yes | rule |" in page


def test_a_model_made_half_elsewhere_than_its_optimizer_is_a_preview_path(tmp_path, run_amplint):
    # Made half in the function that builds the optimizer: one path does both (AMP016 by
    # default). Made half in an evaluation method: training may never take that path.
    (tmp_path / "m.py").write_text(textwrap.dedent("""\
        import torch


        class Runner:
            def __init__(self, net, lr, half):
                self.net = net.cuda()
                if half:
                    self.net = self.net.half()
                self.opt = torch.optim.SGD(self.net.parameters(), lr=lr)

            def fit(self, x):
                self.net(x).sum().backward()
                self.opt.step()


        class Evaluator:
            def __init__(self, net):
                self.net = net
                self.opt = torch.optim.Adam(self.net.parameters())

            def export(self):
                self.net = self.net.half()

            def fit(self, x):
                self.net(x).sum().backward()
                self.opt.step()
    """))
    assert _codes(run_amplint, tmp_path) == [(9, "AMP016")]
    assert _codes(run_amplint, tmp_path, "--preview") == [(9, "AMP016"), (19, "AMP016")]


def test_a_region_around_a_caller_in_the_file_is_evidence(tmp_path, run_amplint):
    # `forward` runs `self._match` (and it `self._pad`) under autocast switched by a flag: the
    # meeting in `_pad` is reported by default, naming the region, the flag and the call. The
    # same meeting in a function no region of the file reaches is a preview path.
    (tmp_path / "m.py").write_text(textwrap.dedent("""\
        import torch
        from torch import nn


        class Matcher(nn.Module):
            def __init__(self, use_amp=False):
                super().__init__()
                self.use_amp = use_amp
                self.proj = nn.Linear(8, 8)

            def forward(self, x):
                with torch.autocast("cuda", enabled=self.use_amp):
                    return self._match(x)

            def _match(self, x):
                return self._pad(self.proj(x))

            def _pad(self, scores):
                keep = torch.nonzero(scores.amax(0) > 0).squeeze(1)
                full = torch.zeros(scores.shape[0], 16, device=scores.device)
                full[:, keep] = scores[:, keep]
                return full


        def pad_alone(scores):
            keep = torch.nonzero(scores.amax(0) > 0).squeeze(1)
            full = torch.zeros(scores.shape[0], 16, device=scores.device)
            full[:, keep] = scores[:, keep]
            return full


        matcher = Matcher(use_amp=True)
    """))
    result = run_amplint("check", "--no-cache", "--output-format", "json", "m.py", cwd=tmp_path)
    [finding] = json.loads(result.stdout)
    assert (finding["location"]["row"], finding["code"]) == (20, "AMP003")
    assert "under the autocast of line 12 when `self.use_amp` is true, through the call on line 13" \
        in finding["message"]
    assert [(r["location"]["row"], r["message"]) for r in finding["related"]] == [(13, "runs it under autocast")]
    assert _codes(run_amplint, tmp_path, "--preview") == [(20, "AMP003"), (27, "AMP003")]


def test_an_epsilon_in_a_helper_run_under_float16_autocast_is_reported_by_default(tmp_path, run_amplint):
    (tmp_path / "m.py").write_text(textwrap.dedent("""\
        import torch


        def similarity(q, k):
            scores = q @ k.T
            return torch.log(scores + 1e-8)


        def counts_ratio(hits, total):
            return hits / (total + 1e-8)


        def embed(encoder, batch, hits, total):
            with torch.autocast("cuda", dtype=torch.float16):
                q = encoder(batch)
                return similarity(q, q), counts_ratio(hits, total)
    """))
    result = run_amplint("check", "--no-cache", "--output-format", "json", "m.py", cwd=tmp_path)
    [finding] = json.loads(result.stdout)
    # `scores` comes from a matmul autocast runs in float16; what `counts_ratio` is given is not
    # seen, so its epsilon is left alone.
    assert (finding["location"]["row"], finding["code"]) == (6, "AMP018")
    assert "under the float16 autocast of line 14, through the call on line 16" in finding["message"]
