"""Written for device run 40: a PPO update. Rollouts of 16 environments x 128 steps sampled
from torch.distributions.Categorical over 18 actions (an actor and a critic MLP), GAE
advantages computed backwards over time, then 4 epochs of 8 shuffled minibatches with the
clipped surrogate, value loss and entropy bonus, gradient clipping and Adam (foreach)."""
import os

import torch
import torch.nn as nn
from torch.distributions import Categorical

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
E, T, A, OBS = 16, 128, 18, 128
actor = nn.Sequential(nn.Linear(OBS, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                      nn.Linear(256, A)).to(device)
critic = nn.Sequential(nn.Linear(OBS, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                       nn.Linear(256, 1)).to(device)
params = list(actor.parameters()) + list(critic.parameters())
opt = torch.optim.Adam(params, lr=2.5e-4, eps=1e-5)
obs = torch.zeros(T, E, OBS, device=device)
acts = torch.zeros(T, E, dtype=torch.long, device=device)
logps = torch.zeros(T, E, device=device)
vals = torch.zeros(T, E, device=device)
rews = torch.randn(T, E, device=device)
with torch.no_grad():
    for t in range(T):
        o = torch.randn(E, OBS, device=device)
        dist = Categorical(logits=actor(o))
        a = dist.sample()
        obs[t], acts[t], logps[t] = o, a, dist.log_prob(a)
        vals[t] = critic(o).squeeze(-1)
    adv = torch.zeros(T, E, device=device)
    last = torch.zeros(E, device=device)
    for t in reversed(range(T)):
        nxt = vals[t + 1] if t + 1 < T else torch.zeros(E, device=device)
        delta = rews[t] + 0.99 * nxt - vals[t]
        last = delta + 0.99 * 0.95 * last
        adv[t] = last
    ret = adv + vals
b_obs, b_act, b_logp = obs.reshape(-1, OBS), acts.reshape(-1), logps.reshape(-1)
b_adv, b_ret = adv.reshape(-1), ret.reshape(-1)
for epoch in range(4):
    perm = torch.randperm(T * E, device=device)
    for mb in perm.split(T * E // 8):
        dist = Categorical(logits=actor(b_obs[mb]))
        ratio = (dist.log_prob(b_act[mb]) - b_logp[mb]).exp()
        a_n = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
        pg = torch.max(-a_n * ratio, -a_n * ratio.clamp(0.8, 1.2)).mean()
        v = (critic(b_obs[mb]).squeeze(-1) - b_ret[mb]).pow(2).mean()
        loss = pg + 0.5 * v - 0.01 * dist.entropy().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
print(float(loss))
