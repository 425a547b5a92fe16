"""AMP021 (a gradient penalty built from `torch.autograd.grad` of a scaled loss) on projects
written to disk, through the real CLI: the penalty added to the loss in the same method,
through a helper that takes the scaled value, and from a helper that returns the penalty to
its caller; and the same code unscaling the gradients first, on which it stays silent."""

import json

from click.testing import CliRunner

from amplint.cli import main
from projects import write_files

MODELS = """\
import torch


class Critic(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))

    def forward(self, x):
        return self.net(x)
"""


def _findings(tmp_path, files):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'gan'\n")
    (tmp_path / "models.py").write_text(MODELS)
    write_files(tmp_path, files)
    result = CliRunner().invoke(main, ["check", "--select", "AMP021", "--output-format", "json", "--no-cache",
                                       str(tmp_path)])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.output)


def _where(finding):
    return finding["filename"].rsplit("/", 1)[-1], finding["location"]["row"], finding["location"]["column"]


def _related(finding):
    return [(r["filename"].rsplit("/", 1)[-1], r["location"]["row"], r["message"]) for r in finding["related"]]


def test_a_gradient_norm_penalty_added_to_the_loss_in_the_same_step(tmp_path):
    [finding] = _findings(tmp_path, {"train.py": """\
        import torch
        from models import Critic


        class Trainer:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = model, optimizer
                self.grad_scaler = torch.amp.GradScaler("cuda")

            def step(self, inputs, targets, weight=0.01):
                with torch.autocast("cuda", dtype=torch.float16):
                    task_loss = torch.nn.functional.cross_entropy(self.model(inputs), targets)
                params = [p for p in self.model.parameters() if p.requires_grad]
                grads = torch.autograd.grad(self.grad_scaler.scale(task_loss), params, create_graph=True)
                grad_norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
                total_loss = task_loss + weight * grad_norm
                self.grad_scaler.scale(total_loss).backward()
                self.grad_scaler.step(self.optimizer)
                self.grad_scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
        """})
    assert _where(finding) == ("train.py", 14, 17)
    assert finding["message"].startswith(
        "`torch.autograd.grad` of `self.grad_scaler.scale(task_loss)` returns gradients multiplied by the loss "
        "scale, and line 16 adds a penalty built from them to `total_loss` without dividing by "
        "`self.grad_scaler.get_scale()`")
    assert _related(finding) == [("train.py", 16, "the penalty built from the scaled gradients")]


def test_a_penalty_helper_given_the_scaled_critic_output(tmp_path):
    [finding] = _findings(tmp_path, {"wgan.py": """\
        import torch
        from torch import autograd
        from models import Critic


        def input_gradient_norm(outputs, inputs):
            (grad,) = autograd.grad(outputs=outputs, inputs=inputs, create_graph=True)
            return grad.flatten(1).norm(2, dim=1)


        def critic_step(critic: Critic, real, fake, opt, scaler, gp_weight=10.0):
            alpha = torch.rand(real.size(0), 1, device=real.device)
            mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
            with torch.autocast("cuda"):
                wasserstein = critic(fake).mean() - critic(real).mean()
                mixed_scores = critic(mixed)
            norms = input_gradient_norm(scaler.scale(mixed_scores.sum()), mixed)
            gp = ((norms - 1) ** 2).mean()
            opt.zero_grad()
            scaler.scale(wasserstein + gp_weight * gp).backward()
            scaler.step(opt)
            scaler.update()
        """})
    assert _where(finding) == ("wgan.py", 17, 13)
    assert finding["message"].startswith(
        "`input_gradient_norm(...)` runs `torch.autograd.grad` (line 7) of `scaler.scale(mixed_scores.sum())`, "
        "which returns gradients multiplied by the loss scale, and line 20 backpropagates a penalty built from them")
    assert _related(finding) == [("wgan.py", 20, "the penalty built from the scaled gradients")]


def test_a_penalty_returned_by_a_method_and_added_to_the_loss_by_its_caller(tmp_path):
    [finding] = _findings(tmp_path, {"r1.py": """\
        import torch
        import torch.nn.functional as F


        class R1Regularized:
            def __init__(self, disc, opt):
                self.disc, self.opt = disc, opt
                self.scaler = torch.amp.GradScaler()

            def r1_penalty(self, real):
                real = real.detach().requires_grad_(True)
                with torch.autocast("cuda"):
                    logits = self.disc(real)
                grads = torch.autograd.grad(self.scaler.scale(logits.sum()), real, create_graph=True)[0]
                return grads.pow(2).flatten(1).sum(1).mean()

            def disc_step(self, real, fake, gamma=10.0):
                with torch.autocast("cuda"):
                    d_loss = F.softplus(self.disc(fake)).mean() + F.softplus(-self.disc(real)).mean()
                d_loss = d_loss + 0.5 * gamma * self.r1_penalty(real)
                self.scaler.scale(d_loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
        """})
    assert _where(finding) == ("r1.py", 14, 17)
    assert "line 20 adds a penalty built from them to `d_loss` without dividing by `self.scaler.get_scale()`" \
        in finding["message"]
    assert _related(finding) == [("r1.py", 20, "the penalty built from the scaled gradients")]


def test_the_same_penalties_unscaled_first_stay_silent(tmp_path):
    assert _findings(tmp_path, {"train.py": """\
        import torch


        def step(model, inputs, targets, optimizer, scaler, weight=0.01):
            with torch.autocast("cuda", dtype=torch.float16):
                task_loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            scaled_grads = torch.autograd.grad(scaler.scale(task_loss), list(model.parameters()), create_graph=True)
            inv_scale = 1.0 / scaler.get_scale()
            grads = [g * inv_scale for g in scaled_grads]
            total_loss = task_loss + weight * torch.sqrt(sum(g.pow(2).sum() for g in grads))
            scaler.scale(total_loss).backward()
            scaler.step(optimizer)
            scaler.update()


        def critic_step(critic, real, opt, scaler):
            real = real.detach().requires_grad_(True)
            with torch.autocast("cuda"):
                scores = critic(real)
            grads = list(torch.autograd.grad(scaler.scale(scores.sum()), [real], create_graph=True))
            torch._foreach_div_(grads, scaler.get_scale())
            d_loss = scores.mean() + sum(g.pow(2).flatten(1).sum(1).mean() for g in grads)
            scaler.scale(d_loss).backward()
            scaler.step(opt)
            scaler.update()


        def log_scaled_norm(model, loss, scaler, writer, step):
            grads = torch.autograd.grad(scaler.scale(loss), model.parameters(), retain_graph=True)
            writer.add_scalar("grad_norm/scaled", torch.stack([g.norm() for g in grads]).norm().item(), step)
        """}) == []
