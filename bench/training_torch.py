"""The PyTorch + PEFT side of the training benchmark: the same GGUF (dequantised to f32 by
transformers' GGUF loader), LoRA r8/alpha16 on q,k,v,o,gate,up,down, the same packed sequences,
forward + backward + AdamW per step, on the CPU with the given number of threads.

Prints one JSON line: {"step_seconds": [...], "peak_rss_mb": ...}.
"""
import argparse, json, os, resource, time

ap = argparse.ArgumentParser()
ap.add_argument("gguf")
ap.add_argument("--rows", type=int, default=4)
ap.add_argument("--len", type=int, default=256)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()

import torch
torch.set_num_threads(a.threads)
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model

d, f = os.path.split(os.path.abspath(a.gguf))
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, betas=(0.9, 0.99), weight_decay=0.1)

# The same token ids as crates/train/examples/train_step.rs: sequence s, position i -> 100 + (7i + 13s) % 20000.
ids = torch.tensor([[100 + (i * 7 + s * 13) % 20000 for i in range(a.len)] for s in range(a.rows)])
times = []
for step in range(a.steps):
    t = time.time()
    logits = model(input_ids=ids).logits[:, a.len // 2 - 1:-1]           # predict the second half
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, a.len // 2:, None])
    loss = logp.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 0.1)
    opt.step()
    opt.zero_grad()
    times.append(time.time() - t)
print(json.dumps({"step_seconds": times, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
