"""The probe: asks the installed PyTorch's dispatcher what autocast does to each op.

Every module here imports torch except ``render``, which only formats tables that are
already made (so ``probe diff`` works without torch). The linter imports none of them.
"""
