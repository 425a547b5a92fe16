"""A model made float16 by a project function or method of one module and trained by a plain
optimizer in another (AMP016): a factory returning it half, a helper converting its argument, a
method of the model's own class, a dtype chosen by a flag. Real projects on disk, the real CLI;
the finding sits on the optimizer and names the call, the helper's conversion and the switch."""



from projects import findings, write_files

RESNET = """\
import torch
from torch import nn


class ResNet18(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3), nn.BatchNorm2d(64), nn.ReLU())
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.head(self.stem(x).mean((2, 3)))
"""

FACTORY = """\
import copy

import torch

from .resnet import ResNet18


def build_model(cfg):
    model = ResNet18(num_classes=cfg.num_classes)
    if cfg.pretrained:
        model.load_state_dict(torch.load(cfg.pretrained, map_location="cpu"))
    model = model.cuda().half()
    return model


def build_model_for(cfg, fp16=False):
    dtype = torch.float16 if fp16 else torch.float32
    return ResNet18(num_classes=cfg.num_classes).to(device="cuda", dtype=dtype)


def export_half(model):
    return copy.deepcopy(model).half().eval()


def prepare(model, mode="train"):
    model.cuda()
    if mode == "export":
        model.half()
    return model
"""


def _project(tmp_path, files: dict[str, str]):
    root = write_files(tmp_path / "proj", {"pyproject.toml": "[project]\nname = 'proj'\n", **files})
    for package in {p.parent for p in root.rglob("*.py")} - {root}:
        (package / "__init__.py").touch()
    return root


def _findings(root, monkeypatch, *options):
    return findings(root, "AMP016", monkeypatch, *options)


def test_a_factory_of_another_module_returns_the_model_half(tmp_path, monkeypatch):
    root = _project(tmp_path, {"vision/models/resnet.py": RESNET, "vision/models/factory.py": FACTORY,
                               "vision/train.py": """\
        import torch
        import torch.nn.functional as F

        from .models.factory import build_model


        def train(cfg, loader):
            model = build_model(cfg)
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.05)
            for epoch in range(cfg.epochs):
                for images, labels in loader:
                    logits = model(images.cuda(non_blocking=True).half())
                    loss = F.cross_entropy(logits.float(), labels.cuda())
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
        """})
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("vision/train.py", 9)
    assert "the float16 parameters of `model` (`build_model(...)` on line 8 returns it made float16: " \
           "`model.cuda().half()`, vision/models/factory.py:12)" in message
    assert related == [("vision/train.py", 8, "`build_model(...)` makes `model` float16"),
                       ("vision/models/factory.py", 12, "`model.cuda().half()`, in `build_model`")]


def test_a_helper_converts_its_argument_and_a_method_of_the_model_class_converts_self(tmp_path, monkeypatch):
    root = _project(tmp_path, {
        "nlp/precision.py": """\
            def convert_to_fp16(module):
                for param in module.parameters():
                    param.data = param.data.half()
            """,
        "nlp/layers.py": """\
            from torch import nn


            class HalfPrecisionMixin:
                def to_half_precision(self):
                    self.half()
                    return self
            """,
        "nlp/modeling.py": """\
            from torch import nn

            from .layers import HalfPrecisionMixin


            class Encoder(HalfPrecisionMixin, nn.Module):
                def __init__(self, vocab_size, hidden):
                    super().__init__()
                    self.embed = nn.Embedding(vocab_size, hidden)
                    self.layers = nn.TransformerEncoder(nn.TransformerEncoderLayer(hidden, 8), 6)

                def forward(self, tokens):
                    return self.layers(self.embed(tokens))
            """,
        "nlp/train.py": """\
            import torch

            from nlp import precision
            from nlp.modeling import Encoder


            def pretrain(args, loader):
                encoder = Encoder(args.vocab_size, args.hidden).cuda()
                encoder.to_half_precision()
                optimizer = torch.optim.Adam(encoder.parameters(), lr=args.lr)
                for tokens, targets in loader:
                    loss = encoder(tokens.cuda()).float().logsumexp(-1).mean()
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()


            def finetune(args, head, loader):
                precision.convert_to_fp16(head)
                optimizer = torch.optim.SGD(head.parameters(), lr=args.lr, momentum=0.9)
                for features, labels in loader:
                    loss = torch.nn.functional.cross_entropy(head(features).float(), labels)
                    loss.backward()
                    optimizer.step()
            """})
    found = _findings(root, monkeypatch)
    assert [(f, r) for f, r, _, _ in found] == [("nlp/train.py", 10), ("nlp/train.py", 20)]
    (_, _, method, method_related), (_, _, helper, helper_related) = found
    # the method is the mixin's: Python finds it on the first base of Encoder
    assert "of `encoder` (`encoder.to_half_precision(...)` on line 9 makes it float16: `self.half()`, " \
           "nlp/layers.py:6)" in method
    assert method_related == [("nlp/train.py", 9, "`encoder.to_half_precision(...)` makes `encoder` float16"),
                              ("nlp/layers.py", 6, "`self.half()`, in `to_half_precision`")]
    assert "of `head` (`precision.convert_to_fp16(...)` on line 19 makes it float16: " \
           "`param.data = param.data.half()`, nlp/precision.py:3)" in helper
    assert ("nlp/precision.py", 3, "`param.data = param.data.half()`, in `convert_to_fp16`") in helper_related


def test_a_dtype_chosen_by_a_flag_names_the_flag(tmp_path, monkeypatch):
    root = _project(tmp_path, {"speech/model.py": RESNET.replace("ResNet18", "Conformer"), "speech/build.py": """\
        import torch

        from .model import Conformer


        def build_model(args):
            dtype = torch.float16 if args.fp16 else torch.float32
            model = Conformer(num_classes=args.vocab)
            return model.to(args.device, dtype=dtype)
        """, "speech/train.py": """\
        import argparse

        import torch

        from speech.build import build_model

        parser = argparse.ArgumentParser()
        parser.add_argument("--fp16", action="store_true", help="train in half precision")
        parser.add_argument("--lr", type=float, default=1e-3)
        args = parser.parse_args()

        model = build_model(args)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        for features, targets in torch.utils.data.DataLoader(dataset, batch_size=32):
            loss = torch.nn.functional.ctc_loss(model(features).log_softmax(-1), targets, lengths, target_lengths)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """})
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("speech/train.py", 13)
    assert "(`build_model(...)` on line 12 returns it made float16: `model.to(args.device, dtype=dtype)`, " \
           "speech/build.py:9), when `--fp16` is set (speech/train.py:8):" in message
    assert related == [("speech/train.py", 12, "`build_model(...)` makes `model` float16"),
                       ("speech/build.py", 9, "`model.to(args.device, dtype=dtype)`, in `build_model`"),
                       ("speech/train.py", 8, "`--fp16` is defined here")]


def test_a_dtype_chosen_by_a_flag_in_the_training_script_itself(tmp_path, monkeypatch):
    root = _project(tmp_path, {"train.py": """\
        import argparse

        import torch
        from torchvision.models import resnet50

        parser = argparse.ArgumentParser()
        parser.add_argument("--half", action="store_true")
        args = parser.parse_args()

        device = torch.device("cuda")
        dtype = torch.float16 if args.half else torch.float32
        model = resnet50(num_classes=100).to(device, dtype)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images.to(device, dtype)), labels.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """})
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("train.py", 13)
    assert "of `model` (`resnet50(num_classes=100).to(device, dtype)` on line 12), when `--half` is set " \
           "(train.py:7):" in message
    assert related == [("train.py", 7, "`--half` is defined here")]


def test_a_helper_parameter_that_turns_float16_on_is_answered_by_the_call(tmp_path, monkeypatch):
    root = _project(tmp_path, {"vision/models/resnet.py": RESNET, "vision/models/factory.py": FACTORY,
                               "vision/finetune.py": """\
        import torch

        from vision.models.factory import build_model_for


        def finetune(cfg, loader):
            model = build_model_for(cfg)   # float32: fp16 defaults to False
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
            for x, y in loader:
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()


        def finetune_half(cfg, loader):
            if cfg.half:
                model = build_model_for(cfg, fp16=True)
            else:
                model = build_model_for(cfg)
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
            for x, y in loader:
                torch.nn.functional.cross_entropy(model(x.half()), y).backward()
                optimizer.step()
        """})
    [(path, row, message, _)] = _findings(root, monkeypatch)
    assert (path, row) == ("vision/finetune.py", 19)
    assert "(`build_model_for(...)` on line 16 returns it made float16: " \
           "`ResNet18(num_classes=cfg.num_classes).to(device='cuda', d...`, vision/models/factory.py:18), " \
           "when `cfg.half` is true:" in message


def test_correct_training_beside_half_models_stays_silent(tmp_path, monkeypatch):
    root = _project(tmp_path, {"vision/models/resnet.py": RESNET, "vision/models/factory.py": FACTORY,
                               "vision/models/registry.py": """\
        from .resnet import ResNet18


        def get_model(name, **kwargs):
            return {"resnet18": ResNet18}[name](**kwargs)
        """, "vision/distill.py": """\
        import torch
        import torch.nn.functional as F

        from .models.factory import build_model, export_half, prepare
        from .models.registry import get_model
        from .models.resnet import ResNet18


        def distill(cfg, loader):
            teacher = build_model(cfg)   # float16, never trained
            student = ResNet18(num_classes=cfg.num_classes).cuda()
            optimizer = torch.optim.AdamW(student.parameters(), lr=cfg.lr)
            scaler = torch.amp.GradScaler("cuda")
            for images, _ in loader:
                with torch.no_grad():
                    soft = teacher(images.cuda().half()).float().softmax(-1)
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = F.kl_div(student(images.cuda()).log_softmax(-1), soft, reduction="batchmean")
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            deployed = export_half(student)   # a float16 copy: the trained student stays float32
            torch.onnx.export(deployed, images.cuda().half(), "student.onnx")


        def master_weights(cfg, loader):
            model = build_model(cfg)
            master = [p.detach().clone().float().requires_grad_() for p in model.parameters()]
            optimizer = torch.optim.SGD(master, lr=cfg.lr)
            for images, labels in loader:
                F.cross_entropy(model(images.cuda().half()).float(), labels.cuda()).backward()
                for p, m in zip(model.parameters(), master):
                    m.grad = p.grad.float()
                optimizer.step()


        def finetune_in_float32(cfg, loader):
            model = build_model(cfg)
            model.float()   # the half weights loaded, trained in float32
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
            for images, labels in loader:
                F.cross_entropy(model(images.cuda()), labels.cuda()).backward()
                optimizer.step()


        def prepared_for_training(cfg, loader):
            model = prepare(ResNet18(num_classes=cfg.num_classes))   # half only for mode="export"
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
            for images, labels in loader:
                F.cross_entropy(model(images.cuda()), labels.cuda()).backward()
                optimizer.step()


        def unknown_class(cfg, loader):
            model = get_model("resnet18", num_classes=10)
            model.to_half_precision()   # which class's method the code does not show
            optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
            for images, labels in loader:
                F.cross_entropy(model(images), labels).backward()
                optimizer.step()
        """, "vision/predict.py": """\
        import torch

        from .models.factory import build_model


        @torch.inference_mode()
        def predict(cfg, images):
            model = build_model(cfg).eval()
            return model(images.cuda().half()).argmax(-1)
        """})
    assert _findings(root, monkeypatch, "--preview") == []


def test_a_conversion_in_another_method_than_the_optimizer_is_preview(tmp_path, monkeypatch):
    root = _project(tmp_path, {"nlp/precision.py": """\
        def convert_to_fp16(module, enabled=True):
            if enabled:
                module.half()
        """, "nlp/trainer.py": """\
        import torch

        from nlp.precision import convert_to_fp16


        class Trainer:
            def __init__(self, model, args):
                self.args = args
                self.model = model.cuda()
                self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr)

            def enable_fp16(self):
                convert_to_fp16(self.model, enabled=self.args.fp16)

            def train_step(self, batch):
                loss = self.model(**batch).loss
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad()
        """})
    # the conversion runs where `enable_fp16` is called, which this file does not show
    assert _findings(root, monkeypatch) == []
    [(path, row, message, related)] = _findings(root, monkeypatch, "--preview")
    assert (path, row) == ("nlp/trainer.py", 10)
    assert "of `self.model` (`convert_to_fp16(...)` on line 13 makes it float16: `module.half()`, " \
           "nlp/precision.py:3), when `self.args.fp16` is true:" in message
    assert related == [("nlp/trainer.py", 13, "`convert_to_fp16(...)` makes `self.model` float16"),
                       ("nlp/precision.py", 3, "`module.half()`, in `convert_to_fp16`")]
