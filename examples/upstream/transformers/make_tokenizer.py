"""A small word-level tokenizer trained on a text file and saved for
``AutoTokenizer.from_pretrained(DIR)`` (run_clm.py's and run_mlm.py's --tokenizer_name), with
the padding and mask tokens run_mlm.py's masking needs: nothing downloaded.

usage: python make_tokenizer.py TEXT_FILE DIR [--vocab 500]
"""

import argparse

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text")
    parser.add_argument("dir")
    parser.add_argument("--vocab", type=int, default=500)
    args = parser.parse_args()
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<eos>", "<pad>", "<mask>"]
    tokenizer.train([args.text], trainers.WordLevelTrainer(vocab_size=args.vocab,
                                                           special_tokens=special))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>",
                            pad_token="<pad>", mask_token="<mask>",
                            model_max_length=1024).save_pretrained(args.dir)


if __name__ == "__main__":
    main()
