"""Accelerate with LocalSGD: the structure of accelerate's examples/by_feature/local_sgd.py,
reduced to run offline.

Adapted from accelerate's local_sgd.py (its arguments, its flow: an Accelerator with mixed
precision and gradient accumulation, a sentence-pair classifier, AdamW with a linear
schedule, prepare(), then per epoch a new `with LocalSGD(...)` block around the training
loop, `local_sgd.step()` after each optimizer step inside `accelerator.accumulate`, and an
evaluation of the epoch's model), written anew: a tiny BERT built from a config instead of
bert-base-cased, MRPC's task made up in code (is the second sentence a shuffled copy of the
first?) instead of the hub's GLUE, accuracy and F1 computed here instead of
`evaluate.load`. Its diff to local_sgd_platoon.py is docs/accelerate.md's. Example:

    python local_sgd.py --cpu --gradient_accumulation_steps 2 --mixed_precision bf16
"""

import argparse

import torch
from torch.optim import AdamW
from torch.utils.data import DataLoader
from transformers import (BertConfig, BertForSequenceClassification,
                          get_linear_schedule_with_warmup, set_seed)

from accelerate import Accelerator, DistributedType
from platoon.integrations.accelerate import LocalSGD  # platoon's: same arguments, step()

EVAL_BATCH_SIZE = 32
VOCAB, LENGTH = 64, 12


def sentence_pairs(n, seed):
    """`n` tokenized pairs ([CLS] s1 [SEP] s2 [SEP]); label 1: s2 is s1 shuffled."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(n):
        first = torch.randint(3, VOCAB, (LENGTH,), generator=g)
        label = i % 2
        second = first[torch.randperm(LENGTH, generator=g)] if label else \
            torch.randint(3, VOCAB, (LENGTH,), generator=g)
        ids = torch.cat([torch.tensor([1]), first, torch.tensor([2]), second, torch.tensor([2])])
        types = torch.cat([torch.zeros(LENGTH + 2, dtype=torch.long),
                           torch.ones(LENGTH + 1, dtype=torch.long)])
        pairs.append({"input_ids": ids, "token_type_ids": types,
                      "attention_mask": torch.ones_like(ids), "labels": torch.tensor(label)})
    return pairs


def get_dataloaders(accelerator: Accelerator, batch_size: int = 16):
    """The train and validation DataLoaders of the made-up pairs."""
    train_dataloader = DataLoader(sentence_pairs(64, 0), shuffle=True, batch_size=batch_size)
    eval_dataloader = DataLoader(sentence_pairs(32, 1), shuffle=False,
                                 batch_size=EVAL_BATCH_SIZE)
    return train_dataloader, eval_dataloader


def training_function(config, args):
    gradient_accumulation_steps = int(args.gradient_accumulation_steps)
    local_sgd_steps = int(args.local_sgd_steps)
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision,
                              gradient_accumulation_steps=gradient_accumulation_steps)
    if accelerator.distributed_type not in [DistributedType.NO, DistributedType.MULTI_CPU,
                                            DistributedType.MULTI_GPU]:
        raise NotImplementedError("LocalSGD is supported only for CPUs and GPUs")
    lr = config["lr"]
    num_epochs = int(config["num_epochs"])
    seed = int(config["seed"])
    batch_size = int(config["batch_size"])

    set_seed(seed)
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=2 * LENGTH + 3))
    model = model.to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=2,
        num_training_steps=(len(train_dataloader) * num_epochs))
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

    for epoch in range(num_epochs):
        model.train()
        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps,
                      enabled=local_sgd_steps is not None) as local_sgd:
            for batch in train_dataloader:
                with accelerator.accumulate(model):
                    output = model(**batch)
                    loss = output.loss
                    accelerator.backward(loss)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
                    local_sgd.step()

        model.eval()
        predictions, references = [], []
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            gathered = accelerator.gather_for_metrics((outputs.logits.argmax(dim=-1),
                                                       batch["labels"]))
            predictions.append(gathered[0])
            references.append(gathered[1])
        predicted, true = torch.cat(predictions), torch.cat(references)
        hits = int(((predicted == 1) & (true == 1)).sum())
        eval_metric = {"accuracy": float((predicted == true).float().mean()),
                       "f1": 2 * hits / max(1, int(predicted.sum()) + int(true.sum()))}
        accelerator.print(f"epoch {epoch}:", eval_metric)


def main():
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None,
                        choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--local_sgd_steps", type=int, default=8)
    parser.add_argument("--cpu", action="store_true", help="train on the CPU")
    args = parser.parse_args()
    config = {"lr": 2e-3, "num_epochs": 2, "seed": 42, "batch_size": 8}
    training_function(config, args)


if __name__ == "__main__":
    main()
