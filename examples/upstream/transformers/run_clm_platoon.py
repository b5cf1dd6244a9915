"""Causal language modelling with the Trainer: the structure of transformers'
examples/pytorch/language-modeling/run_clm.py, reduced to run offline.

Adapted from transformers' run_clm.py (its arguments, its flow: parse three dataclasses,
load text files, a tokenizer from --tokenizer_name, a model from --model_type and
--config_overrides, tokenize, group into blocks, train with --resume_from_checkpoint, save,
log and save the train metrics, evaluate with accuracy and perplexity), written anew without
`datasets` and `evaluate` (whose metrics come from the hub): the text files are read and
grouped here, and accuracy is computed with numpy. Its diff to run_clm_platoon.py is
docs/huggingface.md's. Example (a tokenizer from make_tokenizer.py):

    python run_clm.py --model_type gpt2 --config_overrides n_embd=32,n_layer=1,n_head=2 \
        --tokenizer_name tok --train_file train.txt --validation_file valid.txt \
        --block_size 32 --do_train --do_eval --output_dir out --max_steps 20
"""

import logging
import math
import sys
from dataclasses import dataclass, field
from itertools import chain
from typing import Optional

import numpy as np
import transformers
from transformers import (
    CONFIG_MAPPING,
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
import platoon.integrations.huggingface_auto  # noqa: F401 (each Trainer: a platoon worker)

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which model to train from scratch, and the tokenizer."""

    model_type: str = field(default="gpt2", metadata={"help": "a model type to build anew"})
    config_overrides: Optional[str] = field(
        default=None, metadata={"help": "config settings, as n_embd=32,n_layer=1"})
    tokenizer_name: Optional[str] = field(
        default=None, metadata={"help": "a tokenizer's directory (make_tokenizer.py)"})


@dataclass
class DataTrainingArguments:
    """The text to train and evaluate on."""

    train_file: Optional[str] = field(default=None, metadata={"help": "a .txt file"})
    validation_file: Optional[str] = field(default=None, metadata={"help": "a .txt file"})
    max_train_samples: Optional[int] = field(default=None)
    max_eval_samples: Optional[int] = field(default=None)
    block_size: Optional[int] = field(default=None, metadata={"help": "tokens per example"})

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
    model = AutoModelForCausalLM.from_config(config)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))

    block_size = data_args.block_size or min(1024, config.max_position_embeddings)

    def group_texts(examples):
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = (len(joined["input_ids"]) // block_size) * block_size
        result = {k: [t[i:i + block_size] for i in range(0, total, block_size)]
                  for k, t in joined.items()}
        result["labels"] = [list(ids) for ids in result["input_ids"]]
        return [dict(zip(result, values)) for values in zip(*result.values())]

    lm = {split: group_texts(dict(tokenizer(text["text"]))) for split, text in raw.items()}

    train_dataset = eval_dataset = None
    if training_args.do_train:
        train_dataset = lm["train"][:data_args.max_train_samples]
    if training_args.do_eval:
        eval_dataset = lm["validation"][:data_args.max_eval_samples]

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds  # the prediction at t is for the label at t + 1
        preds, labels = preds[:, :-1].reshape(-1), labels[:, 1:].reshape(-1)
        return {"accuracy": float(np.mean(preds == labels))}

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        compute_metrics=compute_metrics if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics
        if training_args.do_eval else None,
    )

    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint
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
