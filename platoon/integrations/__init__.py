"""platoon inside the training frameworks researchers already use.

One module per framework, each importable only when its framework is installed (this package
imports none of them): `platoon.integrations.huggingface` makes a Hugging Face ``Trainer``
script a platoon worker (docs/huggingface.md).
"""
