"""A plain Accelerate loop (prepare, backward, optimizer.step(), save_state) made a platoon
worker by one import, `platoon.integrations.accelerate_auto` (tests/integrations/
test_accelerate.py): STEPS optimizer steps on made-up data, then save_state(OUT_DIR).

usage: accel_auto_worker.py OUT_DIR STEPS
"""

import sys

import torch
from accelerate import Accelerator

import platoon.integrations.accelerate_auto  # noqa: F401  (the one line)


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8,
                                       shuffle=True)
    accelerator = Accelerator(cpu=True)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    done = 0
    while done < steps:
        for xb, yb in data:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if done == steps:
                break
    accelerator.save_state(out)


if __name__ == "__main__":
    main()
