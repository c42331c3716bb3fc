"""An encoder service that batches requests itself: handler threads put each request (1-8
sequences of 16-512 tokens) on a queue; one batcher thread takes what is waiting (up to 32
sequences, waiting at most 5 ms for more), pads to the longest, runs one BERT-base forward
(random weights, fp16) and hands each request its rows. The probe tags each batch, on the
batcher thread that allocates for it, with its items and padded tokens. See common.py."""
import queue
import threading

import common

MAX_SEQS = 32
MAX_WAIT_S = 0.005


class Batcher:
    def __init__(self, model, probe_getter):
        self.model = model
        self.q = queue.Queue()
        self.probe_getter = probe_getter
        threading.Thread(target=self.loop, name="batcher", daemon=True).start()

    def submit(self, n, length):
        job = {"n": n, "length": length, "done": threading.Event(), "out": None, "err": None}
        self.q.put(job)
        job["done"].wait()
        if job["err"] is not None:
            raise job["err"]
        return job["out"]

    def loop(self):
        import time

        import torch

        while True:
            jobs = [self.q.get()]
            seqs = jobs[0]["n"]
            t_end = time.monotonic() + MAX_WAIT_S
            while seqs < MAX_SEQS:
                try:
                    j = self.q.get(timeout=max(0.0, t_end - time.monotonic()))
                except queue.Empty:
                    break
                if seqs + j["n"] > MAX_SEQS:
                    self.q.put(j)  # next batch
                    break
                jobs.append(j)
                seqs += j["n"]
            longest = max(j["length"] for j in jobs)
            probe = self.probe_getter()
            try:
                with probe.request(items=seqs, tokens=seqs * longest), torch.no_grad():
                    ids = torch.randint(0, 30522, (seqs, longest), device="cuda")
                    mask = torch.zeros_like(ids)
                    row = 0
                    for j in jobs:
                        mask[row:row + j["n"], :j["length"]] = 1
                        row += j["n"]
                    out = self.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
                    norms = out.float().norm(dim=1).tolist()
                    del out, ids, mask
                row = 0
                for j in jobs:
                    j["out"] = norms[row:row + j["n"]]
                    row += j["n"]
            except Exception as e:  # an OOM fails every request of the batch
                for j in jobs:
                    j["err"] = e
            for j in jobs:
                j["done"].set()


_state = {}


def load():
    import torch
    import transformers
    from vramroom import probe as vramroom_probe

    transformers.logging.set_verbosity_error()
    with torch.device("cuda"):  # initialised on the GPU: a restart takes seconds
        model = transformers.BertModel(transformers.BertConfig()).to(torch.float16).eval()
    return Batcher(model, lambda: vramroom_probe.start())


def handle(batcher, body, probe):
    n = max(1, min(int(body.get("n", 1)), 8))
    length = max(8, min(int(body.get("length", 128)), 512))
    v = batcher.submit(n, length)
    return {"n": n, "length": length, "v": v[0]}


if __name__ == "__main__":
    common.serve(common.args(), load, handle)
