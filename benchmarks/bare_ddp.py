"""The baseline for the entry point's overhead: torchrun + DDP + AdamW on the same model and data, nothing else.

    torchrun --nproc-per-node N benchmarks/bare_ddp.py MODEL_DIR DATA.jsonl STEPS BATCH SEQ OUT.json

Measured as the trainer measures itself (dockyard/train/callbacks.py): the steady state is the steps after the
first WARMUP_STEPS, timed between two device synchronisations, with every rank's real (non-padding) tokens summed.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

WARMUP_STEPS = 5  # as dockyard.train.callbacks: left out of the steady state

model_dir, data_file, steps, batch, seq, out = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), sys.argv[6]
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, world, local = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
tok = AutoTokenizer.from_pretrained(model_dir)
texts = [json.loads(line)["text"] for line in open(data_file)]
ids = [tok(t)["input_ids"][:seq - 1] + [tok.eos_token_id] for t in texts]
model = torch.nn.parallel.DistributedDataParallel(
    AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device),
    device_ids=[local] if cuda else None)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(rank)
tokens, start, lengths = 0, None, []
for step in range(1, steps + 1):
    rows = [ids[i] for i in torch.randint(len(ids), (batch,), generator=gen).tolist()]
    width = max(map(len, rows))
    x = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows], device=device)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
    labels = x.masked_fill(mask == 0, -100)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
        loss = model(input_ids=x, attention_mask=mask, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step == min(WARMUP_STEPS, steps - 1):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
    elif start is not None:
        tokens += sum(map(len, rows))  # counted on the host: no wait for the GPU each step (the trainer has none)
        lengths += [len(r) for r in rows]
if cuda:
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
total = torch.tensor([tokens], device=device)
dist.all_reduce(total)
if rank == 0:
    json.dump({"tokens_per_second": total.item() / seconds, "tokens": total.item(), "seconds": seconds,
               "steps": steps - min(WARMUP_STEPS, steps - 1), "lengths": lengths, "loss": loss.item(),
               "peak_memory_bytes": torch.cuda.max_memory_reserved() if cuda else None}, open(out, "w"))
dist.barrier()  # nobody tears down gloo while rank 0 still writes
dist.destroy_process_group()
