"""platoon inside the training frameworks researchers already use.

One module per framework, each importable only when its framework is installed (this package
imports none of them): `platoon.integrations.huggingface` makes a Hugging Face ``Trainer``
script a platoon worker (docs/huggingface.md); `platoon.integrations.lightning.PlatoonStrategy`
does the same for a Lightning script, ``lightning`` or ``pytorch_lightning``
(docs/lightning.md); `platoon.integrations.accelerate.LocalSGD` is a drop-in for Accelerate's
``LocalSGD`` (docs/accelerate.md). What they share (counting a torch
optimizer's real steps) is in the private `_core`.
"""
