"""Masked language modelling with the Trainer: the structure of transformers'
examples/pytorch/language-modeling/run_mlm.py, reduced to run offline.

Adapted from transformers' run_mlm.py (its arguments, its flow: parse three dataclasses,
detect the last checkpoint in --output_dir, load text files, a tokenizer from
--tokenizer_name, a model from --model_type and --config_overrides, tokenize (each line, with
--line_by_line, or every text grouped into blocks of --max_seq_length), a
DataCollatorForLanguageModeling masking --mlm_probability of the tokens at random, train
from --resume_from_checkpoint or the checkpoint detected, save, log and save the train
metrics, evaluate with the masked tokens' accuracy and perplexity), written anew without
`datasets` and `evaluate` (whose metrics come from the hub): the text files are read and
grouped here, and accuracy is computed with numpy. As transformers 5 has no
--overwrite_output_dir, a checkpoint detected is resumed, and an output directory holding
none is trained into. Its diff to run_mlm_platoon.py is docs/huggingface.md's. Example (a
tokenizer from make_tokenizer.py):

    python run_mlm.py --model_type bert --config_overrides vocab_size=500,hidden_size=32,\
num_hidden_layers=1,num_attention_heads=2,intermediate_size=64 \
        --tokenizer_name tok --train_file train.txt --validation_file valid.txt \
        --max_seq_length 32 --do_train --do_eval --output_dir out --max_steps 20
"""

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from itertools import chain
from typing import Optional

import numpy as np
import transformers
from transformers import (
    CONFIG_MAPPING,
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which model to train from scratch, and the tokenizer."""

    model_type: str = field(default="bert", metadata={"help": "a model type to build anew"})
    config_overrides: Optional[str] = field(
        default=None, metadata={"help": "config settings, as hidden_size=32,num_hidden_layers=1"})
    tokenizer_name: Optional[str] = field(
        default=None, metadata={"help": "a tokenizer's directory (make_tokenizer.py)"})


@dataclass
class DataTrainingArguments:
    """The text to train and evaluate on, and how it is masked."""

    train_file: Optional[str] = field(default=None, metadata={"help": "a .txt file"})
    validation_file: Optional[str] = field(default=None, metadata={"help": "a .txt file"})
    max_seq_length: Optional[int] = field(default=None, metadata={"help": "tokens per example"})
    mlm_probability: float = field(default=0.15,
                                   metadata={"help": "the share of tokens masked for the loss"})
    line_by_line: bool = field(default=False,
                               metadata={"help": "each non-empty line an example of its own"})
    pad_to_max_length: bool = field(default=False)
    max_train_samples: Optional[int] = field(default=None)
    max_eval_samples: Optional[int] = field(default=None)

    def __post_init__(self):
        if self.train_file is None and self.validation_file is None:
            raise ValueError("Need a training or a validation file.")


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return {"text": f.read().splitlines(keepends=True)}  # as the text loader keeps them


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        handlers=[logging.StreamHandler(sys.stdout)])
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    transformers.utils.logging.set_verbosity(log_level)

    # Detecting last checkpoint.
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir) and training_args.do_train:
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
        if last_checkpoint is not None and training_args.resume_from_checkpoint is None:
            logger.info(f"Checkpoint detected, resuming training at {last_checkpoint}. To avoid "
                        "this behavior, change the `--output_dir`.")

    set_seed(training_args.seed)

    raw = {}
    if data_args.train_file is not None:
        raw["train"] = read_lines(data_args.train_file)
    if data_args.validation_file is not None:
        raw["validation"] = read_lines(data_args.validation_file)

    config = CONFIG_MAPPING[model_args.model_type]()
    if model_args.config_overrides is not None:
        config.update_from_string(model_args.config_overrides)
    if not model_args.tokenizer_name:
        raise ValueError("Training a tokenizer here is not supported: make one (make_tokenizer.py)"
                         " and pass --tokenizer_name.")
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name)
    model = AutoModelForMaskedLM.from_config(config)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))

    max_seq_length = min(data_args.max_seq_length or 1024, tokenizer.model_max_length)

    if data_args.line_by_line:
        padding = "max_length" if data_args.pad_to_max_length else False

        def tokenize(texts):
            lines = [line for line in texts["text"] if len(line) > 0 and not line.isspace()]
            encoded = tokenizer(lines, padding=padding, truncation=True,
                                max_length=max_seq_length, return_special_tokens_mask=True)
            return [dict(zip(encoded, values)) for values in zip(*encoded.values())]
    else:
        def tokenize(texts):
            encoded = dict(tokenizer(texts["text"], return_special_tokens_mask=True))
            joined = {k: list(chain(*encoded[k])) for k in encoded}
            total = len(joined["input_ids"])
            if total >= max_seq_length:
                total = (total // max_seq_length) * max_seq_length
            blocks = {k: [t[i:i + max_seq_length] for i in range(0, total, max_seq_length)]
                      for k, t in joined.items()}
            return [dict(zip(blocks, values)) for values in zip(*blocks.values())]

    tokenized = {split: tokenize(text) for split, text in raw.items()}

    train_dataset = eval_dataset = None
    if training_args.do_train:
        train_dataset = tokenized["train"][:data_args.max_train_samples]
    if training_args.do_eval:
        eval_dataset = tokenized["validation"][:data_args.max_eval_samples]

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        labels, preds = labels.reshape(-1), preds.reshape(-1)
        mask = labels != -100  # the masked tokens only
        return {"accuracy": float(np.mean(preds[mask] == labels[mask]))}

    # Data collator: masks the tokens at random, anew for every batch
    pad_to_multiple_of_8 = data_args.line_by_line and training_args.fp16 \
        and not data_args.pad_to_max_length
    data_collator = DataCollatorForLanguageModeling(
        tokenizer=tokenizer,
        mlm_probability=data_args.mlm_probability,
        pad_to_multiple_of=8 if pad_to_multiple_of_8 else None,
    )

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=data_collator,
        compute_metrics=compute_metrics if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics
        if training_args.do_eval else None,
    )

    if training_args.do_train:
        checkpoint = None
        if training_args.resume_from_checkpoint is not None:
            checkpoint = training_args.resume_from_checkpoint
        elif last_checkpoint is not None:
            checkpoint = last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        try:
            metrics["perplexity"] = math.exp(metrics["eval_loss"])
        except OverflowError:
            metrics["perplexity"] = float("inf")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
