"""AMP018 (an epsilon below float16's smallest value where the value it guards is float16) reads
Python's ast: found in a float16 autocast region (around the epsilon, or around a call of its
function), in a class the file converts to float16, in a public function on its caller's
tensors, and in a loss of a project that enables float16 autocast elsewhere; silent where the
value is float32 or widened, where the epsilon survives, and where a condition tests the
guarded value first. Through the real CLI on projects written to disk."""

from projects import findings, write_files

_MESSAGE = "is below float16's smallest value (≈5.96e-8) and rounds to 0"


def _project(root, files):
    return write_files(root, {"pyproject.toml": '[project]\nname = "trainer"\n', **files})


def test_in_a_float16_region_an_operand_and_a_keyword_are_found(tmp_path, monkeypatch):
    root = _project(tmp_path, {"contrastive.py": """
        import torch
        import torch.nn.functional as F


        def contrastive_step(encoder, head, images, temperature=0.07):
            with torch.autocast("cuda"):
                feats = F.linear(encoder(images), head.weight)
                scale = feats.abs().amax(dim=-1, keepdim=True) + (1e-9)
                ratios = (feats / scale).clamp(min=1e-10)
                unit = F.normalize(ratios, dim=-1, eps=1e-12)
                logits = unit @ unit.t() / temperature
                probs = torch.softmax(logits, dim=-1)
                entropy = -(probs * torch.log(probs + 1e-9)).sum(-1)
                stats = F.layer_norm(feats, feats.shape[-1:], eps=1e-12)
            return logits, entropy, stats
        """})
    assert findings(root, "AMP018", monkeypatch) == [
        ("contrastive.py", 9, f"`(1e-9)` {_MESSAGE} in this float16 region: use ≥ 1e-6 or compute in float32", []),
        ("contrastive.py", 10, f"`min=1e-10` {_MESSAGE} in this float16 region", []),
    ]


def test_a_clamp_in_a_region_is_found_only_on_a_value_that_may_be_float16(tmp_path, monkeypatch):
    root = _project(tmp_path, {"pooling.py": """
        import torch


        def masked_mean_pool(encoder, tokens, mask):
            with torch.autocast("cuda"):
                hidden = encoder(tokens)
                weights = mask.unsqueeze(-1).float()
                counts = torch.clamp(weights.sum(1), min=1e-9)
                pooled = (hidden * weights).sum(1) / counts
                attn = torch.bmm(pooled.unsqueeze(1), hidden.transpose(1, 2)).clamp(min=1e-9)
                return pooled, torch.log(attn)
        """})
    assert findings(root, "AMP018", monkeypatch) == [
        ("pooling.py", 11, f"`min=1e-9` {_MESSAGE} in this float16 region", []),
    ]


def test_a_helper_called_in_a_region_names_the_region_and_the_call(tmp_path, monkeypatch):
    root = _project(tmp_path, {"model.py": """
        import torch
        from torch import nn

        EPS = 1e-10


        class Scorer(nn.Module):
            def forward(self, queries, keys):
                with torch.autocast("cuda", dtype=torch.float16):
                    return self.score(queries, keys)

            def score(self, queries, keys):
                sims = torch.bmm(queries, keys.transpose(1, 2))
                return sims / (sims.abs() + EPS)


        class WideScorer(nn.Module):
            def forward(self, queries, keys):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return self.score(queries, keys)

            def score(self, queries, keys):
                sims = torch.bmm(queries, keys.transpose(1, 2))
                return sims / (sims.abs() + EPS)
        """})
    assert findings(root, "AMP018", monkeypatch) == [
        ("model.py", 15, (f"`EPS` {_MESSAGE} in float16: this runs under the float16 autocast of line 10, "
                          "through the call on line 11: use ≥ 1e-6 or compute in float32"),
         [("model.py", 11, "runs it under float16 autocast")]),
    ]


def test_a_class_the_file_converts_to_float16_guards_in_float16(tmp_path, monkeypatch):
    root = _project(tmp_path, {"infer.py": """
        import torch
        from torch import nn


        class Embedder(nn.Module):
            def __init__(self, backbone):
                super().__init__()
                self.backbone = backbone

            def forward(self, images, eps: float = 1e-8):
                feats = self.backbone(images)
                norms = feats.abs().sum(dim=-1, keepdim=True).clamp(min=eps)
                return feats / norms


        class WideEmbedder(nn.Module):
            def forward(self, images):
                feats = self.backbone(images).float()
                return feats / (feats.abs().sum(dim=-1, keepdim=True) + 1e-8)


        def load(path):
            embedder = Embedder(torch.load(path))
            embedder = embedder.cuda().eval()
            wide = WideEmbedder().cuda().half()
            return embedder.half(), wide
        """})
    assert findings(root, "AMP018", monkeypatch) == [
        ("infer.py", 13, (f"`eps` (line 11) {_MESSAGE} in `Embedder`, which `embedder.half()` on line 27 "
                          "converts to float16: the guard does nothing; use ≥ 1e-6 or compute this step in float32"),
         []),
    ]


def test_a_public_function_on_its_caller_s_tensors_is_a_preview_finding(tmp_path, monkeypatch):
    root = _project(tmp_path, {"geometry.py": """
        import torch
        from torch import Tensor


        def rotation_axis(rotvec: Tensor, eps: float = 1e-10) -> Tensor:
            angle = torch.linalg.vector_norm(rotvec, dim=-1, keepdim=True)
            return rotvec / angle.clamp(min=eps)


        def log_odds(logits: Tensor) -> Tensor:
            p = torch.sigmoid(logits)
            return torch.log(p + 1e-12) - torch.log(1 - p + 1e-12)


        def _unit(v: Tensor) -> Tensor:
            return v / (v.norm(dim=-1, keepdim=True) + 1e-10)


        def safe_axis(rotvec: Tensor) -> Tensor:
            angle = rotvec.norm(dim=-1, keepdim=True)
            if angle.min() > 1e-3:
                return rotvec / (angle + 1e-10)
            return rotvec


        def checked_axis(rotvec: Tensor) -> Tensor:
            if rotvec.dtype == torch.float16:
                raise TypeError("compute the axis in float32")
            return rotvec / (rotvec.norm(dim=-1, keepdim=True) + 1e-10)
        """})
    assert findings(root, "AMP018", monkeypatch) == []
    found = findings(root, "AMP018", monkeypatch, "--preview")
    assert [(f[0], f[1]) for f in found] == [("geometry.py", 8), ("geometry.py", 13), ("geometry.py", 13)]
    assert found[0][2].startswith(f"`eps` (line 6) {_MESSAGE} when this runs in float16 (a float16 `rotvec` or "
                                  "model), where the norm it guards reaches 0: the division gives inf/NaN")
    assert "where the probability it guards reaches 0: the log gives inf/NaN" in found[1][2]


def test_a_loss_in_a_project_that_enables_float16_autocast_names_the_region(tmp_path, monkeypatch):
    root = _project(tmp_path, {
        "train.py": """
            import torch


            def train_step(model, criterion, batch):
                with torch.autocast("cuda"):
                    out = model(batch["image"])
                    return criterion(out, batch["mask"])
            """,
        "losses/dice.py": """
            import torch
            from torch import nn


            class SoftDiceLoss(nn.Module):
                def forward(self, logits, mask):
                    inter = (logits * mask).sum(dim=(2, 3))
                    union = logits.sum(dim=(2, 3)) + mask.sum(dim=(2, 3))
                    spread = logits.amax(dim=(2, 3)) - logits.amin(dim=(2, 3))
                    scaled = logits / (spread[..., None, None] + 1e-9)
                    dice = 2 * inter / (union + 1e-9)
                    hits = mask.count_nonzero()
                    recall = inter.sum() / (hits + 1e-9)
                    target_area = mask.flatten(1)
                    coverage = logits.flatten(1) / (target_area + 1e-9)
                    return 1 - dice.mean() + scaled.mean() + recall + coverage.mean()
            """})
    assert findings(root, "AMP018", monkeypatch) == []
    assert findings(root, "AMP018", monkeypatch, "--preview") == [
        ("losses/dice.py", 11, (f"`1e-9` {_MESSAGE} in float16, and this project runs code under float16 autocast "
                                "(train.py:6): if `SoftDiceLoss.forward` runs there, the division it guards gives "
                                "inf/NaN at 0; use ≥ 1e-6 or compute this step in float32"),
         [("train.py", 6, "autocast entered here")]),
    ]
