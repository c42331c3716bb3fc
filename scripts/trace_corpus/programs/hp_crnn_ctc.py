"""Written for device run 41: a CRNN text recogniser, a small CNN over 32 x 128 grey
line images collapsed to a 32-step sequence, a 2-layer bidirectional nn.LSTM of 256 and
CTC over 37 symbols (F.ctc_loss on padded int64 targets of 4 to 16 symbols); Adam;
batch 64."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
B, C = 64, 37


def block(i, o, pool):
    return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
            nn.MaxPool2d(pool)]


class CRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.cnn = nn.Sequential(*block(1, 64, 2), *block(64, 128, 2), *block(128, 256, (2, 1)),
                                 *block(256, 256, (4, 1)))
        self.rnn = nn.LSTM(256, 256, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(512, C)

    def forward(self, x):
        f = self.cnn(x).squeeze(2).permute(2, 0, 1)  # [T, B, 256]
        y, _ = self.rnn(f)
        return self.fc(y).log_softmax(2)


model = CRNN().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(3)
for step in range(4):
    x = torch.randn(B, 1, 32, 128, generator=g).to(device)
    tl = torch.randint(4, 17, (B,), generator=g)
    tg = torch.randint(1, C, (B, 16), generator=g).to(device)
    lp = model(x)
    il = torch.full((B,), lp.shape[0], dtype=torch.long)
    loss = F.ctc_loss(lp, tg, il, tl)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss))
