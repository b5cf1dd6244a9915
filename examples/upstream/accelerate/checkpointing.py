"""Accelerate with save_state/load_state: the structure of accelerate's
examples/by_feature/checkpointing.py, reduced to run offline.

Adapted from accelerate's checkpointing.py (its arguments, --mixed_precision, --cpu,
--checkpointing_steps (a number of batches, or "epoch"), --output_dir,
--resume_from_checkpoint, and its flow: gradient accumulation when the batch size is above
MAX_GPU_BATCH_SIZE, prepare(), `accelerator.load_state` of the checkpoint named and the
epoch or batch it was taken at read from its directory's name, `skip_first_batches` for the
batches of the resumed epoch already trained, `accelerator.save_state` to `step_{n}` or
`epoch_{n}` under --output_dir, an evaluation after each epoch), written anew: a tiny BERT
built from a config instead of bert-base-cased, MRPC's task made up in code (is the second
sentence a shuffled copy of the first?) instead of the hub's GLUE, accuracy and F1 computed
here instead of `evaluate.load`, and MAX_GPU_BATCH_SIZE 8 with a batch size of 16 (two
micro-batches a step) for a model this small. Its diff to checkpointing_platoon.py is
docs/accelerate.md's. Example:

    python checkpointing.py --cpu --mixed_precision bf16 --checkpointing_steps epoch \
        --output_dir out
    python checkpointing.py --cpu --mixed_precision bf16 --resume_from_checkpoint out/epoch_0
"""

import argparse
import os

import torch
from torch.optim import AdamW
from torch.utils.data import DataLoader, default_collate
from transformers import (BatchEncoding, BertConfig, BertForSequenceClassification,
                          get_linear_schedule_with_warmup, set_seed)

from accelerate import Accelerator

MAX_GPU_BATCH_SIZE = 8
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

    def collate_fn(examples):
        # a BatchEncoding, as the tokenizer's pad() gives (the loop calls batch.to(device))
        return BatchEncoding(default_collate(examples))

    train_dataloader = DataLoader(sentence_pairs(64, 0), shuffle=True, collate_fn=collate_fn,
                                  batch_size=batch_size)
    eval_dataloader = DataLoader(sentence_pairs(32, 1), shuffle=False, collate_fn=collate_fn,
                                 batch_size=EVAL_BATCH_SIZE)
    return train_dataloader, eval_dataloader


def training_function(config, args):
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    lr = config["lr"]
    num_epochs = int(config["num_epochs"])
    seed = int(config["seed"])
    batch_size = int(config["batch_size"])

    # Save every epoch ("epoch") or every this many batches (a number)
    if hasattr(args.checkpointing_steps, "isdigit"):
        if args.checkpointing_steps == "epoch":
            checkpointing_steps = args.checkpointing_steps
        elif args.checkpointing_steps.isdigit():
            checkpointing_steps = int(args.checkpointing_steps)
        else:
            raise ValueError(f"Argument `checkpointing_steps` must be either a number or "
                             f"`epoch`. `{args.checkpointing_steps}` passed.")
    else:
        checkpointing_steps = None

    set_seed(seed)

    # If the batch size is too big we use gradient accumulation
    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE

    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=2 * LENGTH + 3))
    model = model.to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=2,
        num_training_steps=(len(train_dataloader) * num_epochs) // gradient_accumulation_steps)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

    # The batches trained so far, and the epoch to start from
    overall_step = 0
    starting_epoch = 0

    # Load the checkpoint back before training; the epoch (or the batch) it was taken at
    # comes from its directory's name
    if args.resume_from_checkpoint:
        if args.resume_from_checkpoint is not None or args.resume_from_checkpoint != "":
            accelerator.print(f"Resumed from checkpoint: {args.resume_from_checkpoint}")
            accelerator.load_state(args.resume_from_checkpoint)
            path = os.path.basename(args.resume_from_checkpoint)
        else:
            # Get the most recent checkpoint
            dirs = [f.name for f in os.scandir(os.getcwd()) if f.is_dir()]
            dirs.sort(key=os.path.getctime)
            path = dirs[-1]
        # Extract `epoch_{i}` or `step_{i}`
        training_difference = os.path.splitext(path)[0]

        if "epoch" in training_difference:
            starting_epoch = int(training_difference.replace("epoch_", "")) + 1
            resume_step = None
        else:
            resume_step = int(training_difference.replace("step_", ""))
            starting_epoch = resume_step // len(train_dataloader)
            resume_step -= starting_epoch * len(train_dataloader)

    for epoch in range(starting_epoch, num_epochs):
        model.train()
        if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            # Skip the batches of the resumed epoch already trained
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
            overall_step += resume_step
        else:
            active_dataloader = train_dataloader
        for step, batch in enumerate(active_dataloader):
            batch.to(accelerator.device)
            outputs = model(**batch)
            loss = outputs.loss
            loss = loss / gradient_accumulation_steps
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            overall_step += 1

            # save_state: model, optimizer, lr_scheduler, RNG states, to `step_{n}`
            if isinstance(checkpointing_steps, int):
                output_dir = f"step_{overall_step}"
                if overall_step % checkpointing_steps == 0:
                    if args.output_dir is not None:
                        output_dir = os.path.join(args.output_dir, output_dir)
                    accelerator.save_state(output_dir)

        model.eval()
        predictions, references = [], []
        for batch in eval_dataloader:
            batch.to(accelerator.device)
            with torch.no_grad():
                outputs = model(**batch)
            gathered = accelerator.gather((outputs.logits.argmax(dim=-1), batch["labels"]))
            predictions.append(gathered[0])
            references.append(gathered[1])
        predicted, true = torch.cat(predictions), torch.cat(references)
        hits = int(((predicted == 1) & (true == 1)).sum())
        eval_metric = {"accuracy": float((predicted == true).float().mean()),
                       "f1": 2 * hits / max(1, int(predicted.sum()) + int(true.sum()))}
        accelerator.print(f"epoch {epoch}:", eval_metric)

        # save_state to `epoch_{n}`
        if checkpointing_steps == "epoch":
            output_dir = f"epoch_{epoch}"
            if args.output_dir is not None:
                output_dir = os.path.join(args.output_dir, output_dir)
            accelerator.save_state(output_dir)


def main():
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None,
                        choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="train on the CPU")
    parser.add_argument("--checkpointing_steps", type=str, default=None,
                        help="save every n batches (a number), or 'epoch' after each epoch")
    parser.add_argument("--output_dir", type=str, default=".",
                        help="where the checkpoint folders go (default: here)")
    parser.add_argument("--resume_from_checkpoint", type=str, default=None,
                        help="a checkpoint folder to continue training from")
    args = parser.parse_args()
    config = {"lr": 2e-3, "num_epochs": 3, "seed": 42, "batch_size": 16}
    training_function(config, args)


if __name__ == "__main__":
    main()
