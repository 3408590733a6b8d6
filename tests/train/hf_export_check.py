"""Checks zero-ckpt's outputs with the reference readers (gpt_export_test.cpp):
the consolidated file loads with `safetensors`, and transformers'
GPT2LMHeadModel.from_pretrained(<work>/hf) gives zerocpp's logits.

usage: hf_export_check.py WORK BATCH SEQ VOCAB
"""
import sys

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers import GPT2LMHeadModel

work, batch, seq, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
state = load_file(f"{work}/m.safetensors")
assert len(state) > 0 and all(v.dtype == np.float32 for v in state.values()), "consolidated tensors are not fp32"
tokens = np.fromfile(f"{work}/tokens.bin", dtype=np.float32).reshape(batch, seq).astype(np.int64)
ours = np.fromfile(f"{work}/logits.bin", dtype=np.float32).reshape(batch, seq, vocab)
model = GPT2LMHeadModel.from_pretrained(f"{work}/hf", attn_implementation="eager").eval()
with torch.no_grad():
    theirs = model(torch.from_numpy(tokens)).logits.numpy()
diff = float(np.abs(theirs - ours).max())
scale = float(np.abs(ours).max())
# Bytes have no end token: generation runs to max_new_tokens (an eos of
# newline stopped it at the first line break).
assert model.config.eos_token_id is None and model.config.bos_token_id is None, \
    f"the export names special tokens: bos {model.config.bos_token_id}, eos {model.config.eos_token_id}"
line_break = torch.tensor([[10]])
with torch.no_grad():
    made = model.generate(line_break, max_new_tokens=12, do_sample=False, pad_token_id=0)
assert made.shape[1] == 13, f"generate() stopped after {made.shape[1] - 1} of 12 new tokens"
print(f"hf_export_check: max |logit difference| {diff:.3e} (largest logit {scale:.3f}); {len(state)} tensors")
if not diff <= 1e-4 * max(1.0, scale):
    print("FAIL: transformers' GPT2LMHeadModel does not give zerocpp's logits")
    sys.exit(1)
