"""The reference encodings for tests/router/routing.rs's parity test.

stdin: {"model_dir": DIR, "texts": [str], "chats": [[message]]}
stdout: {"texts": [[id] with special tokens], "plain": [[id] without],
         "chats": [{"text": rendered, "ids": [id]}]}

Texts are encoded by the `tokenizers` library itself (padding and truncation off, as
transformers encodes when asked for neither); chats are rendered by transformers'
apply_chat_template with add_generation_prompt=True and encoded without special tokens, as
vLLM does for /v1/chat/completions.
"""
import json
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer

req = json.load(sys.stdin)
tok = Tokenizer.from_file(req["model_dir"] + "/tokenizer.json")
tok.no_padding()
tok.no_truncation()
hf = AutoTokenizer.from_pretrained(req["model_dir"])
out = {"texts": [], "plain": [], "chats": []}
for text in req["texts"]:
    out["texts"].append(tok.encode(text, add_special_tokens=True).ids)
    out["plain"].append(tok.encode(text, add_special_tokens=False).ids)
for messages in req["chats"]:
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    out["chats"].append({"text": text, "ids": tok.encode(text, add_special_tokens=False).ids})
json.dump(out, sys.stdout)
