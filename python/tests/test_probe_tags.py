"""The probe's request tags: which thread ran a request, and whether it ran on a worker thread
while a handler waited (the batcher case `vramroom http --predict` must not stack)."""
import tempfile
import threading
import types

import vramroom.probe as vp


class _Meta:
    def __init__(self):
        self.local = threading.local()
        self.seen = []

    def _get_memory_metadata(self):
        return getattr(self.local, "tag", "")

    def _set_memory_metadata(self, tag):
        self.local.tag = tag
        if tag:
            self.seen.append(tag)


def _probe(monkeypatch):
    meta = _Meta()
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=meta), OutOfMemoryError=MemoryError)
    monkeypatch.setattr(vp, "_torch", lambda: fake)
    p = vp.Probe("127.0.0.1", 0, tempfile.mkdtemp(), record_history=False, max_entries=10)
    monkeypatch.setattr(p, "_request_started", lambda: None)
    monkeypatch.setattr(p, "_request_done", lambda: None)
    return p, meta


def _fields(tag):
    return dict(kv.split("=", 1) for kv in tag.split(";")[1:])


def test_a_request_inside_its_handler_is_not_a_worker(monkeypatch):
    p, meta = _probe(monkeypatch)
    with p._handler_request(10):
        with p.request(items=2, tokens=64):
            inner = meta._get_memory_metadata()
    f = _fields(inner)
    assert f["items"] == "2" and f["tokens"] == "64" and f["thread"] == "1"
    assert "worker" not in f
    p._server.server_close()


def test_a_batcher_thread_tags_its_batches_as_a_worker(monkeypatch):
    p, meta = _probe(monkeypatch)
    go, done = threading.Event(), threading.Event()
    tags = []

    def batcher():
        go.wait(5)
        with p.request(items=4, tokens=512):
            tags.append(meta._get_memory_metadata())
        done.set()

    t = threading.Thread(target=batcher)
    t.start()
    with p._handler_request(20):  # the handler waits for its batch
        go.set()
        assert done.wait(5)
    t.join()
    f = _fields(tags[0])
    assert f["worker"] == "1" and f["thread"] == "2"
    # no handler in flight: a plain request on another thread is not a worker
    with p.request(items=1):
        assert "worker" not in _fields(meta._get_memory_metadata())
    assert p._handler_threads == {}
    p._server.server_close()
