"""torchao's 8-bit AdamW on FSDP2 parameters whose shards are uneven, without optbench: the smallest case of what
`reference-results sharding` records for MiniLM (its 3 x 384 classifier splits 2 rows / 1 row over two ranks).

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/torchao_fsdp2_uneven.py

With torch 2.13 and torchao 0.x (CPU, gloo) rank 1's first `step()` fails inside torchao's compiled single-tensor
step ("AssertionError: expected size 1==2, stride 64==64 at dim=0"): the kernel compiled for rank 0's 2-row shard
is given rank 1's 1-row shard. Exit 0 and "ok" from both ranks means the library no longer has the defect.
"""

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torchao.optim import AdamW8bit


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 64), torch.nn.Linear(64, 3))  # 3 rows over 2 ranks: 2 and 1
    fully_shard(model)
    optimizer = AdamW8bit(model.parameters(), lr=1e-3)
    try:
        for _ in range(2):
            model(torch.randn(8, 4096)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        print(f"rank {dist.get_rank()}: ok", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
