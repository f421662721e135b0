"""Fetching only the vision weights, offline: a sharded checkpoint with a large (sparse) fake decoder,
served by an HTTP server on 127.0.0.1 that honours Range and counts the bytes it sends."""

import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("fsspec", reason="the hub extra (fsspec) is not installed")
pytest.importorskip("aiohttp", reason="the hub extra (aiohttp, for fsspec's HTTP file system) is not installed")

from safetensors import safe_open

import moonvit_kernels
from moonvit_kernels import cli, hub
from moonvit_kernels import weights as W
from moonvit_kernels.config import VisionConfig

CFG = VisionConfig.tiny()
DECODER_BYTES = 512 * 2**20  # per decoder shard, a hole in the file (no disk blocks)


# ============================================================================ the checkpoint
def write_shard(path: Path, tensors: dict) -> None:
    """A safetensors file by hand: values are arrays, or (dtype tag, shape) for a hole of that size."""
    header, offset, blobs = {}, 0, []
    for name, value in tensors.items():
        if isinstance(value, tuple):
            tag, shape = value
            size = 2 * int(np.prod(shape))
            blobs.append((offset, None))
        else:
            tag, shape = "BF16", value.shape
            data = np.ascontiguousarray(value, dtype=ml_dtypes.bfloat16).tobytes()
            size = len(data)
            blobs.append((offset, data))
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        start = f.tell()
        for where, data in blobs:
            if data is not None:
                f.seek(start + where)
                f.write(data)
        f.truncate(start + offset)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """Three shards: vision + decoder, decoder only, vision + a small decoder tensor; bf16 throughout."""
    root = tmp_path_factory.mktemp("k3")
    wts = W.random_weights(CFG, seed=11)
    names = sorted(wts)
    rows = DECODER_BYTES // (2 * 4096)
    shards = {
        "model-00001-of-00003.safetensors": {
            **{n: wts[n] for n in names[:7]},
            "language_model.layers.0.mlp.weight": ("BF16", (rows, 4096)),
        },
        "model-00002-of-00003.safetensors": {"language_model.layers.1.mlp.weight": ("BF16", (rows, 4096))},
        "model-00003-of-00003.safetensors": {
            "language_model.embed.weight": ("BF16", (64, 32)),
            **{n: wts[n] for n in names[7:]},
        },
    }
    weight_map = {}
    for shard, tensors in shards.items():
        write_shard(root / shard, tensors)
        weight_map.update(dict.fromkeys(tensors, shard))
    (root / W.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (root / "config.json").write_text(json.dumps({"model_type": "kimi_k3", "vision_config": CFG.to_dict()}))
    return root


def raw_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every vision tensor of a checkpoint folder in its stored dtype, viewed as raw bits."""
    out = {}
    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), framework="np") as f:
            for k in f.keys():
                if W.is_vision_key(k):
                    t = f.get_tensor(k)
                    out[k] = (t.dtype.name, np.ascontiguousarray(t).view(np.uint8).copy())
    return out


def expected_reads(root: Path, manifest: dict) -> int:
    """config.json + index + each vision shard's header + the vision tensors' bytes."""
    return (
        (root / "config.json").stat().st_size
        + (root / W.INDEX_NAME).stat().st_size
        + sum(manifest["header_bytes"].values())
        + manifest["vision_bytes"]
    )


# ============================================================================ the server
class RangeServer(ThreadingHTTPServer):
    """Serves a folder on 127.0.0.1; honours `Range: bytes=a-b` unless told not to; counts body bytes;
    can drop the connection after `fail_after` more body bytes, or go silent (`stall_seconds`) after
    `stall_after`, then hang up (or, with `stall_resumes`, go on). With `validators` (as nginx does) it
    sends ETag and Last-Modified and answers 412 to an If-Match / If-Unmodified-Since that no longer holds."""

    daemon_threads = True

    def __init__(self, root: Path, honour_range: bool = True, validators: bool = True):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.honour_range, self.validators = root, honour_range, validators
        self.bytes_served = 0
        self.fail_after: int | None = None
        self.stall_after: int | None = None
        self.stall_seconds = 0.0
        self.stall_resumes = False
        self.requested: list[str] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/ckpt"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms delayed-ACK stall each

    def log_message(self, *args):
        pass

    def _file(self) -> Path | None:
        rel = unquote(urlparse(self.path).path)
        if not rel.startswith("/ckpt/"):
            return None
        path = self.server.root / rel.removeprefix("/ckpt/")
        return path if path.is_file() else None

    def _missing(self, status: int = 404) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _validators(self, path: Path) -> dict:
        st = path.stat()
        if not self.server.validators:
            return {}
        return {"ETag": f'"{st.st_mtime_ns:x}-{st.st_size:x}"', "Last-Modified": formatdate(st.st_mtime, usegmt=True)}

    def do_HEAD(self):
        path = self._file()
        if path is None:
            return self._missing()
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        for k, v in self._validators(path).items():
            self.send_header(k, v)
        if self.server.honour_range:
            self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self):
        path = self._file()
        if path is None:
            return self._missing()
        validators = self._validators(path)
        if_match = self.headers.get("If-Match")
        if validators and if_match and if_match != validators["ETag"]:
            return self._missing(412)
        since = self.headers.get("If-Unmodified-Since")
        if validators and since and since != validators["Last-Modified"]:
            return self._missing(412)
        size = path.stat().st_size
        start, end = 0, size
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m and self.server.honour_range:
            start, end = int(m.group(1)), min(size, int(m.group(2)) + 1 if m.group(2) else size)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(end - start))
        for k, v in validators.items():
            self.send_header(k, v)
        self.end_headers()
        with self.server.lock:
            self.server.requested.append(path.name)
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start
            while left:
                data = f.read(min(left, 2**20))
                with self.server.lock:
                    stall = self.server.stall_after
                    stalled = stall is not None and stall < len(data)
                    rest = b""
                    if stalled:
                        data, rest, self.server.stall_after = data[:stall], data[stall:], None
                    elif stall is not None:
                        self.server.stall_after = stall - len(data)
                    budget = self.server.fail_after
                    if budget is not None and budget < len(data):
                        data, self.server.fail_after = data[:budget], None
                        cut = True
                    else:
                        cut = False
                        if budget is not None:
                            self.server.fail_after = budget - len(data)
                    self.server.bytes_served += len(data)
                try:
                    self.wfile.write(data)
                    if stalled:
                        self.wfile.flush()
                        time.sleep(self.server.stall_seconds)  # silent, connection open
                        if not self.server.stall_resumes:
                            self.close_connection = True
                            return
                        self.wfile.write(rest)
                        with self.server.lock:
                            self.server.bytes_served += len(rest)
                        left -= len(rest)
                except (BrokenPipeError, ConnectionResetError):  # the client hung up: fine
                    return
                if cut:
                    self.close_connection = True
                    return
                left -= len(data)


@pytest.fixture
def server(checkpoint):
    srv = RangeServer(checkpoint)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


# ============================================================================ tests
def test_fetch_over_http_reads_only_headers_and_vision_bytes(checkpoint, server, tmp_path):
    manifest = hub.fetch(server.url, tmp_path / "v", progress=False)
    total = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    assert manifest["checkpoint_bytes"] == total > 2 * DECODER_BYTES
    assert server.bytes_served == manifest["bytes_read_this_run"] == expected_reads(checkpoint, manifest)
    assert server.bytes_served < total / 1000
    print(f"\nfetch read {server.bytes_served:,} bytes over HTTP of a {total:,}-byte checkpoint")
    assert "model-00002-of-00003.safetensors" not in server.requested  # the decoder-only shard: untouched
    # bit for bit, original dtypes, and a checkpoint that loads
    assert raw_tensors(tmp_path / "v").keys() == raw_tensors(checkpoint).keys()
    for k, (dtype, bits) in raw_tensors(checkpoint).items():
        got_dtype, got_bits = raw_tensors(tmp_path / "v")[k]
        assert got_dtype == dtype == "bfloat16"
        np.testing.assert_array_equal(got_bits, bits)
    config, got = W.load_checkpoint(tmp_path / "v")
    assert config == CFG and set(got) == set(W.expected_shapes(CFG))
    # the manifest: byte ranges and hashes of the source bytes
    entry = manifest["tensors"]["mm_projector.proj.2.weight"]
    shard = checkpoint / entry["shard"]
    a, b = entry["byte_range"]
    with open(shard, "rb") as f:
        f.seek(a)
        assert hashlib.sha256(f.read(b - a)).hexdigest() == entry["sha256"]
    assert json.loads((tmp_path / "v" / hub.MANIFEST_NAME).read_text())["tensors"] == manifest["tensors"]
    assert not (tmp_path / "v" / hub.PARTS_DIR).exists()


def test_a_second_fetch_reads_only_headers(server, checkpoint, tmp_path):
    first = hub.fetch(server.url, tmp_path / "v", progress=False)
    server.bytes_served = 0
    again = hub.fetch(server.url, tmp_path / "v", progress=False)
    assert (
        server.bytes_served == again["bytes_read_this_run"] == expected_reads(checkpoint, first) - first["vision_bytes"]
    )


def test_local_folder_gives_the_same_tensors(checkpoint, server, tmp_path):
    local = hub.fetch(str(checkpoint), tmp_path / "local", progress=False)
    remote = hub.fetch(server.url, tmp_path / "remote", progress=False)
    assert local["tensors"] == remote["tensors"]
    assert local["bytes_read_this_run"] == remote["bytes_read_this_run"]


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """Retries of broken requests without the production pause (1, 2, 4 s)."""
    monkeypatch.setattr(hub, "RETRY_PAUSE", 0.01)


def test_resume_after_an_interrupted_transfer(checkpoint, server, tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "RETRIES", 0)  # the run gives up at the first drop: the next run resumes
    full = hub.fetch(str(checkpoint), tmp_path / "reference", progress=False)
    overhead = expected_reads(checkpoint, full) - full["vision_bytes"]
    server.fail_after = overhead + full["vision_bytes"] // 2  # the connection drops half way
    with pytest.raises(hub.FetchError, match="run the fetch again to resume"):
        hub.fetch(server.url, tmp_path / "v", progress=False, chunk_bytes=4096)
    kept = sum(p.stat().st_size for p in (tmp_path / "v" / hub.PARTS_DIR).glob("*.part"))
    assert 0 < kept < full["vision_bytes"]
    assert not (tmp_path / "v" / "model.safetensors").exists()
    server.bytes_served = 0
    again = hub.fetch(server.url, tmp_path / "v", progress=False, chunk_bytes=4096)
    assert again["vision_bytes_fetched_this_run"] == full["vision_bytes"] - kept
    assert server.bytes_served == overhead + full["vision_bytes"] - kept
    assert again["tensors"] == full["tensors"]  # same sha256 for every tensor


@pytest.mark.parametrize("validators", [True, False])
def test_a_dropped_connection_is_retried_in_the_run_from_where_it_stopped(small, tmp_path, validators):
    """The link drops half way: the run goes on from the last byte that came (what is served twice is at most
    the piece in flight when the connection broke), also from a server without validators, whose bytes a
    later run could not vouch for."""
    root, _, wts = small
    reference = hub.fetch(str(root), tmp_path / "reference", progress=False)
    overhead = expected_reads(root, reference) - reference["vision_bytes"]
    srv = serve(root, validators=validators)
    try:
        srv.fail_after = overhead + reference["vision_bytes"] // 2
        got = hub.fetch(srv.url, tmp_path / "v", progress=False, chunk_bytes=4096)
        assert got["vision_bytes_fetched_this_run"] == reference["vision_bytes"]
        assert 0 <= srv.bytes_served - (overhead + reference["vision_bytes"]) < hub.PIECE_BYTES
        assert got["tensors"] == reference["tensors"]
        same_weights(loaded(tmp_path / "v"), wts)
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_link_that_keeps_breaking_gives_up_after_the_retries(small, tmp_path, monkeypatch):
    root, _, _ = small
    srv = serve(root)
    calls = []

    real = hub.HttpSource.stream_range

    def broken(self, name, start, end, expect, sink):
        if not isinstance(sink, hub.PieceWriter):  # config, index and headers: read as usual
            return real(self, name, start, end, expect, sink)
        calls.append(start)
        raise hub.LinkError(f"{self.label}: no data from {self.url(name)} for 1 s; run the fetch again to resume")

    try:
        monkeypatch.setattr(hub.HttpSource, "stream_range", broken)
        with pytest.raises(hub.LinkError, match=r"run the fetch again to resume \(tried 4 times\)"):
            hub.fetch(srv.url, tmp_path / "v", progress=False)
        assert len(calls) == hub.RETRIES + 1 == 4 and len(set(calls)) == 1  # the same place each time
    finally:
        srv.shutdown()
        srv.server_close()


def test_parts_of_another_source_are_not_reused(checkpoint, server, tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "RETRIES", 0)
    server.fail_after = 20_000  # config, index, headers, then part of the tensors
    with pytest.raises(hub.FetchError, match="resume"):
        hub.fetch(server.url, tmp_path / "v", progress=False, chunk_bytes=1024)
    assert any((tmp_path / "v" / hub.PARTS_DIR).glob("*.part"))
    wts = W.random_weights(CFG, seed=13)
    W.save_checkpoint(tmp_path / "other", wts, CFG, dtype="float32")
    with pytest.raises(hub.FetchError, match=f"holds a fetch of {server.url}, not of"):
        hub.fetch(str(tmp_path / "other"), tmp_path / "v", progress=False)
    assert any((tmp_path / "v" / hub.PARTS_DIR).glob("*.part"))  # refused: nothing touched
    manifest = hub.fetch(str(tmp_path / "other"), tmp_path / "v", progress=False, force=True)
    assert manifest["vision_bytes_fetched_this_run"] == manifest["vision_bytes"]  # nothing reused
    _, got = W.load_checkpoint(tmp_path / "v")
    for k, v in wts.items():
        np.testing.assert_array_equal(got[k], v)


def test_fetch_errors_are_clear(checkpoint, server, tmp_path):
    with pytest.raises(hub.FetchError, match=r"no file config\.json"):
        hub.fetch(server.url + "/nowhere", tmp_path / "a", progress=False)
    closed = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = closed.server_address[1]
    closed.server_close()  # nothing listens there now
    with pytest.raises(hub.FetchError, match=r"cannot (reach|read) config\.json"):
        hub.fetch(f"http://127.0.0.1:{port}/ckpt", tmp_path / "c", progress=False)
    with pytest.raises(hub.FetchError, match="not a checkpoint folder"):
        hub.fetch(str(tmp_path / "missing"), tmp_path / "b", progress=False)
    with pytest.raises(hub.FetchError, match="hf://ORG/REPO"):
        hub.parse_hf("hf://just-a-name")
    assert hub.parse_hf("hf://moonshotai/Kimi-K3@v1.0") == ("moonshotai/Kimi-K3", "v1.0")


def test_missing_tensor_is_named(checkpoint, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for p in checkpoint.iterdir():
        (broken / p.name).symlink_to(p)
    index = json.loads((checkpoint / W.INDEX_NAME).read_text())
    index["weight_map"]["vision_tower.encoder.blocks.9.wo.weight"] = "model-00001-of-00003.safetensors"
    (broken / W.INDEX_NAME).unlink()
    (broken / W.INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(hub.FetchError, match=r"blocks\.9\.wo\.weight.*model-00001-of-00003.*does not hold it"):
        hub.fetch(str(broken), tmp_path / "out", progress=False)


def test_a_server_without_range_support_is_refused(checkpoint, tmp_path):
    srv = RangeServer(checkpoint, honour_range=False)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(hub.FetchError, match="does not support HTTP range requests"):
            hub.fetch(srv.url, tmp_path / "v", progress=False)
        # it stopped reading after the first bytes (what socket buffers took), it did not pull a whole shard
        assert srv.bytes_served < 32 * 2**20 < DECODER_BYTES
    finally:
        srv.shutdown()
        srv.server_close()


def test_hf_source_goes_through_the_same_code(checkpoint, tmp_path, monkeypatch):
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    repo = tmp_path / "hub" / "moonshotai" / "Kimi-K3@0123abc"
    repo.parent.mkdir(parents=True)
    repo.symlink_to(checkpoint, target_is_directory=True)
    seen = {}

    def fake_hf(name, revision):
        seen["args"] = (name, revision)
        return DirFileSystem(str(tmp_path / "hub"), fs=LocalFileSystem()), "0123abc"

    monkeypatch.setattr(hub, "hf_filesystem", fake_hf)
    manifest = hub.fetch("hf://moonshotai/Kimi-K3@v2", tmp_path / "v", progress=False)
    assert seen["args"] == ("moonshotai/Kimi-K3", "v2")
    assert manifest["repo"] == "moonshotai/Kimi-K3" and manifest["revision"] == "0123abc"
    assert len(manifest["tensors"]) == len(W.expected_shapes(CFG))
    monkeypatch.setenv("MOONVIT_KERNELS_CACHE", str(tmp_path / "cache"))
    config, got = moonvit_kernels.load_checkpoint("hf://moonshotai/Kimi-K3@v2")  # the public API fetches
    assert config == CFG and (tmp_path / "cache" / "moonshotai--Kimi-K3@v2" / "model.safetensors").is_file()
    with pytest.raises(ValueError, match=r"hf://moonshotai/Kimi-K3@v2: a remote checkpoint.*local folders only"):
        W.load_checkpoint("hf://moonshotai/Kimi-K3@v2")  # weights reads local folders and never imports hub


def test_the_public_load_checkpoint_fetches_an_https_checkpoint_once(server, checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("MOONVIT_KERNELS_CACHE", str(tmp_path / "cache"))
    config, got = moonvit_kernels.load_checkpoint(server.url + "/")
    folder = hub.cache_dir(server.url + "/")
    assert folder.parent == tmp_path / "cache" and (folder / "model.safetensors").is_file()
    _, direct = W.load_checkpoint(folder)
    assert config == CFG and set(got) == set(direct) == set(W.expected_shapes(CFG))
    for name, value in direct.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    served = server.bytes_served
    moonvit_kernels.load_checkpoint(server.url + "/")  # cached: headers are checked, no tensor bytes again
    assert server.bytes_served - served < served / 4


def test_cli_fetch(server, tmp_path, capsys):
    assert cli.main(["fetch", server.url, "--out", str(tmp_path / "v"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "fetched 18 vision tensors" in out and "bytes read this run" in out
    assert cli.main(["fetch", server.url + "/nowhere", "--out", str(tmp_path / "w"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no file config.json" in err[0]


def test_cli_info_on_a_remote_checkpoint_reads_headers_only(server, checkpoint, capsys):
    assert cli.main(["info", server.url]) == 0
    out = capsys.readouterr().out
    assert "vision tensors: 18" in out and "matches its config: yes" in out
    reported = int(re.search(r"read ([\d,]+) bytes", out).group(1).replace(",", ""))
    vision_shards = ["model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    headers = 0
    for shard in vision_shards:
        with open(checkpoint / shard, "rb") as f:
            headers += 8 + struct.unpack("<Q", f.read(8))[0]
    config_and_index = (checkpoint / "config.json").stat().st_size + (checkpoint / W.INDEX_NAME).stat().st_size
    assert reported == config_and_index + headers
    assert reported == server.bytes_served
    assert reported < 64 * 1024  # config, index, two headers: no tensor bytes
    assert "model-00002-of-00003.safetensors" not in server.requested


def test_hf_errors_are_wrapped(monkeypatch):
    import huggingface_hub

    def not_found(self, repo_id, revision=None, **kw):
        raise huggingface_hub.errors.RepositoryNotFoundError(f"404 {repo_id}")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", not_found)
    with pytest.raises(hub.FetchError, match=r"hf://org/missing: cannot resolve revision main"):
        hub.open_source("hf://org/missing")


def test_single_file_checkpoint_and_a_missing_shard(checkpoint, tmp_path):
    wts = W.random_weights(CFG, seed=12)
    decoder = {"language_model.lm_head.weight": np.random.default_rng(0).standard_normal((50, 32)).astype(np.float32)}
    W.save_checkpoint(tmp_path / "one", wts, CFG, dtype="float16", extra_tensors=decoder)
    manifest = hub.fetch(str(tmp_path / "one"), tmp_path / "v", progress=False)
    assert {e["dtype"] for e in manifest["tensors"].values()} == {"F16"}
    assert manifest["vision_bytes"] == 2 * sum(v.size for v in wts.values())
    assert "language_model.lm_head.weight" not in manifest["tensors"]
    _, got = W.load_checkpoint(tmp_path / "v")
    for k, v in wts.items():
        np.testing.assert_array_equal(got[k], v.astype(np.float16).astype(np.float32))

    broken = tmp_path / "broken"
    broken.mkdir()
    for p in checkpoint.iterdir():
        if p.name != "model-00003-of-00003.safetensors":
            (broken / p.name).symlink_to(p)
    with pytest.raises(hub.FetchError, match=r"no file model-00003-of-00003\.safetensors"):
        hub.fetch(str(broken), tmp_path / "w", progress=False)


# ============================================================================ nothing lost, nothing mixed
def serve(root: Path, **kwargs) -> RangeServer:
    srv = RangeServer(root, **kwargs)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def small(tmp_path):
    """A float32 checkpoint in two shards (with an index), served over HTTP: (folder, server, weights)."""
    root = tmp_path / "src"
    wts = W.random_weights(CFG, seed=21)
    W.save_checkpoint(root, wts, CFG, dtype="float32", shards=2)
    srv = serve(root)
    yield root, srv, wts
    srv.shutdown()
    srv.server_close()


def loaded(folder: Path) -> dict:
    config, got = W.load_checkpoint(folder)
    assert config == CFG
    return got


def same_weights(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def top_files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_fetch_checks_its_output_before_reading_the_source(tmp_path):
    (tmp_path / "plain").write_text("x")
    with pytest.raises(hub.FetchError, match="plain is a file, not a folder"):
        hub.fetch("http://127.0.0.1:9/nothing-listens", tmp_path / "plain" / "v", progress=False)


def test_fetch_never_writes_into_its_source(small, capsys):
    root, _, _ = small
    before = top_files(root)
    with pytest.raises(hub.FetchError, match="is the source folder: fetch never writes into its source"):
        hub.fetch(str(root), root, progress=False)
    assert cli.main(["fetch", str(root), "--out", str(root / "."), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "never writes into its source" in err[0]
    assert top_files(root) == before


def test_fetch_refuses_a_checkpoint_it_did_not_write(small, tmp_path):
    root, srv, wts = small
    mine = tmp_path / "mine"
    W.save_checkpoint(mine, W.random_weights(CFG, seed=5), CFG, shards=2)
    before = top_files(mine)
    with pytest.raises(hub.FetchError, match=r"holds a checkpoint that fetch did not write \(config\.json.*--force"):
        hub.fetch(srv.url, mine, progress=False)
    assert top_files(mine) == before
    hub.fetch(srv.url, mine, progress=False, force=True)
    assert sorted(p.name for p in mine.iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    same_weights(loaded(mine), wts)


def test_a_truncated_or_foreign_manifest(small, tmp_path, capsys):
    root, srv, wts = small
    out = tmp_path / "v"
    hub.fetch(srv.url, out, progress=False)
    text = (out / hub.MANIFEST_NAME).read_text()
    for broken in (text[: len(text) // 2], "[]"):  # a truncated manifest, one that is a list
        (out / hub.MANIFEST_NAME).write_text(broken)
        manifest = hub.fetch(srv.url, out, progress=False)  # ours (model.safetensors says so): fetched again
        assert manifest["vision_bytes_fetched_this_run"] == manifest["vision_bytes"]
        same_weights(loaded(out), wts)
    alien = tmp_path / "alien"
    alien.mkdir()
    (alien / hub.MANIFEST_NAME).write_text("[]")
    assert cli.main(["fetch", srv.url, "--out", str(alien), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not write (manifest.json)" in err[0]
    assert cli.main(["fetch", srv.url, "--out", str(alien), "--quiet", "--force"]) == 0
    same_weights(loaded(alien), wts)


def interrupted(monkeypatch, after: int, then=None) -> list:
    """Make `Part.append` (a kept piece) fail after `after` pieces, as a crash or a dropped link would;
    `then` instead runs once at that point and the fetch goes on. Returns [pieces offered so far]."""
    real = hub.Part.append
    count = [0]

    def append(self, data, sync=True):
        count[0] += 1
        if count[0] == after + 1:
            if then is None:
                raise hub.FetchError("interrupted (test)")
            then()
        return real(self, data, sync)

    monkeypatch.setattr(hub.Part, "append", append)
    return count


@pytest.mark.parametrize("kind", ["http", "folder"])
def test_a_resume_after_the_source_changed_starts_over(small, tmp_path, monkeypatch, kind):
    root, srv, _ = small
    source = srv.url if kind == "http" else str(root)
    with monkeypatch.context() as m:
        interrupted(m, after=8)
        with pytest.raises(hub.FetchError, match="interrupted"):
            hub.fetch(source, tmp_path / "v", progress=False, chunk_bytes=2**20)
    assert len(list((tmp_path / "v" / hub.PARTS_DIR).glob("*.part"))) == 9  # 8 complete, 1 empty
    new = W.random_weights(CFG, seed=22)
    W.save_checkpoint(root, new, CFG, dtype="float32", shards=2)  # same names, shapes, sizes, offsets
    manifest = hub.fetch(source, tmp_path / "v", progress=False)
    assert manifest["vision_bytes_fetched_this_run"] == manifest["vision_bytes"]  # nothing of the old kept
    same_weights(loaded(tmp_path / "v"), new)


@pytest.mark.parametrize("kind", ["http", "folder"])
def test_a_source_changing_during_the_fetch_is_never_mixed_in(small, tmp_path, monkeypatch, kind):
    root, srv, _ = small
    source = srv.url if kind == "http" else str(root)
    new = W.random_weights(CFG, seed=23)
    with monkeypatch.context() as m:
        pieces = interrupted(m, after=5, then=lambda: W.save_checkpoint(root, new, CFG, dtype="float32", shards=2))
        with pytest.raises(hub.FetchError, match="changed"):
            hub.fetch(source, tmp_path / "v", progress=False, chunk_bytes=2**20)
    assert pieces[0] == 6  # the piece read before the change; the next read saw it and kept nothing
    assert not (tmp_path / "v" / "model.safetensors").exists()
    hub.fetch(source, tmp_path / "v", progress=False)
    same_weights(loaded(tmp_path / "v"), new)


def test_a_zero_filled_part_is_not_trusted(small, tmp_path, monkeypatch):
    root, srv, wts = small
    with monkeypatch.context() as m:
        interrupted(m, after=30)
        with pytest.raises(hub.FetchError, match="interrupted"):
            hub.fetch(srv.url, tmp_path / "v", progress=False, chunk_bytes=1024)
    parts = sorted((tmp_path / "v" / hub.PARTS_DIR).glob("*.part"))
    assert len(parts) > 1
    for part in parts:  # as after a crash: the file grew to full size, its last bytes never landed
        name = part.name.removesuffix(".part")
        nbytes = 4 * int(np.prod(wts[name].shape))
        data = part.read_bytes()
        part.write_bytes(data[: len(data) // 2] + bytes(nbytes - len(data) // 2))
    manifest = hub.fetch(srv.url, tmp_path / "v", progress=False)
    same_weights(loaded(tmp_path / "v"), wts)
    for name, entry in manifest["tensors"].items():
        a, b = entry["byte_range"]
        with open(root / entry["shard"], "rb") as f:
            f.seek(a)
            assert hashlib.sha256(f.read(b - a)).hexdigest() == entry["sha256"], name


def test_a_stalled_server_times_out_naming_the_url_and_keeps_what_came(small, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(hub, "RETRIES", 0)  # no retry: the stalled request ends the run
    root, srv, wts = small
    reference = hub.fetch(str(root), tmp_path / "reference", progress=False)
    overhead = expected_reads(root, reference) - reference["vision_bytes"]
    srv.stall_after, srv.stall_seconds = overhead + 100, 5.0
    start = time.perf_counter()
    argv = ["fetch", srv.url, "--out", str(tmp_path / "v"), "--timeout", "0.5", "--quiet"]
    assert cli.main(argv) == 2
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no data from {srv.url}/model-0000" in err[0] and "for 0.5 s" in err[0], err
    assert seconds < 4.5
    kept = sum(p.stat().st_size for p in (tmp_path / "v" / hub.PARTS_DIR).glob("*.part"))
    assert kept == 100  # the bytes that did arrive in the stalled (64 MiB) request
    again = hub.fetch(srv.url, tmp_path / "v", progress=False)
    assert again["vision_bytes_fetched_this_run"] == again["vision_bytes"] - 100
    same_weights(loaded(tmp_path / "v"), wts)


def test_chunk_sizes_follow_the_link():
    sizer = hub.ChunkSizer(maximum=64 * 2**20)
    assert sizer.size == 2**20
    sizer.update(2**20, 10.0)  # 100 KiB/s: about 5 s of it next time
    assert sizer.size == 512 * 1024
    sizer.update(0, 60.0)  # a request that timed out with nothing: smaller, not below the minimum
    assert sizer.size == 256 * 1024
    for _ in range(10):  # a fast link: up to the maximum, at most 4x a step
        before = sizer.size
        sizer.update(sizer.size, 0.01)
        assert sizer.size <= 4 * before
    assert sizer.size == 64 * 2**20
    assert hub.ChunkSizer(maximum=4096).size == 4096


def test_a_full_disk_keeps_the_earlier_fetch(small, tmp_path):
    from helpers import file_size_limit

    root, _, _ = small
    out = tmp_path / "v"
    hub.fetch(str(root), out, progress=False)
    before = top_files(out)
    other = tmp_path / "other"
    new = W.random_weights(CFG, seed=24)
    W.save_checkpoint(other, new, CFG, dtype="float32")
    largest = 4 * max(v.size for v in new.values())
    assert len(before["model.safetensors"]) > largest + 4096
    with pytest.raises(OSError, match="model.safetensors"), file_size_limit(largest + 4096):
        hub.fetch(str(other), out, progress=False, force=True)  # the parts fit, the new checkpoint file does not
    assert top_files(out) == before
    again = hub.fetch(str(other), out, progress=False)  # the replacement under way resumes
    assert again["vision_bytes_fetched_this_run"] == 0  # every part was complete and verified
    same_weights(loaded(out), new)


def test_a_server_without_validators_is_not_trusted_across_runs(small, tmp_path, monkeypatch):
    root, _, wts = small
    srv = serve(root, validators=False)
    try:
        with monkeypatch.context() as m:
            interrupted(m, after=8)
            with pytest.raises(hub.FetchError, match="interrupted"):
                hub.fetch(srv.url, tmp_path / "v", progress=False)
        again = hub.fetch(srv.url, tmp_path / "v", progress=False)
        assert again["vision_bytes_fetched_this_run"] == again["vision_bytes"]  # nothing could be vouched for
        same_weights(loaded(tmp_path / "v"), wts)
    finally:
        srv.shutdown()
        srv.server_close()


def test_info_on_a_server_without_range_support_names_the_url(small, capsys):
    root, _, _ = small
    srv = serve(root, honour_range=False)
    try:
        assert cli.main(["info", srv.url]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "does not support HTTP range requests" in err[0] and srv.url in err[0]
    finally:
        srv.shutdown()
        srv.server_close()


# ============================================================================ outputs verified where reused (issue 31)
def test_a_fetch_of_another_source_into_the_same_folder_is_refused(small, tmp_path, capsys):
    root, srv, wts = small
    other = tmp_path / "other"
    other_wts = W.random_weights(CFG, seed=77)
    W.save_checkpoint(other, other_wts, CFG, dtype="float32")
    out = tmp_path / "v"
    hub.fetch(srv.url, out, progress=False)
    before = top_files(out)
    assert cli.main(["fetch", str(other), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"holds a fetch of {srv.url}, not of {other}: pass --force" in err[0]
    assert top_files(out) == before
    manifest = hub.fetch(str(other), out, progress=False, force=True)
    assert manifest["source"] == str(other) and manifest["vision_bytes_fetched_this_run"] == manifest["vision_bytes"]
    same_weights(loaded(out), other_wts)  # every tensor the second source's


def test_a_fetched_checkpoint_changed_on_disk_is_caught_and_fetched_again(small, tmp_path, capsys):
    root, srv, wts = small
    out = tmp_path / "v"
    first = hub.fetch(srv.url, out, progress=False)
    path = out / "model.safetensors"
    name = "vision_tower.patch_embed.proj.weight"
    start, _ = W.SafetensorsFile(path).byte_range(name)
    data = bytearray(path.read_bytes())
    data[start : start + 4] = np.float32(123.0).tobytes()  # same size, another value
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors: changed since fetch wrote it .*fetch again"):
        W.load_checkpoint(out)
    encode = ["encode", str(small_png(tmp_path)), "--weights", str(out), "--out", str(tmp_path / "e.npz"), "--quiet"]
    assert cli.main(encode) == 2
    assert "changed since fetch wrote it" in capsys.readouterr().err
    again = hub.fetch(srv.url, out, progress=False)
    assert again["vision_bytes_fetched_this_run"] == first["vision_bytes"]
    assert again["tensors"] == first["tensors"]
    same_weights(loaded(out), wts)


def test_an_old_manifest_without_file_states_checks_every_tensor(small, tmp_path):
    root, srv, wts = small
    out = tmp_path / "v"
    hub.fetch(srv.url, out, progress=False)
    manifest = json.loads((out / hub.MANIFEST_NAME).read_text())
    del manifest["written"]
    (out / hub.MANIFEST_NAME).write_text(json.dumps(manifest))
    same_weights(loaded(out), wts)
    path = out / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # one flipped bit in the last tensor
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"tensor '.*' changed since fetch wrote it"):
        W.load_checkpoint(out)


def small_png(folder: Path) -> Path:
    """An 8x8 grey picture in `folder`."""
    from PIL import Image

    path = folder / "small.png"
    Image.fromarray(np.full((8, 8, 3), 100, dtype=np.uint8)).save(path)
    return path


# ======================================================= interrupted, killed, slow (issue 31, finding 9)
def kept_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in (out / hub.PARTS_DIR).glob("*.part"))


def stall_after_first_bytes(root: Path, srv: RangeServer, tmp_path: Path, nbytes: int, seconds: float) -> None:
    """Make the server send `nbytes` of the first vision tensor, then go silent for `seconds`."""
    reference = hub.fetch(str(root), tmp_path / "reference", progress=False)
    srv.stall_after = expected_reads(root, reference) - reference["vision_bytes"] + nbytes
    srv.stall_seconds = seconds


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_ctrl_c_keeps_the_bytes_of_the_request_in_flight(small, tmp_path):
    root, srv, wts = small
    stall_after_first_bytes(root, srv, tmp_path, 100, seconds=5.0)
    out = tmp_path / "v"

    def interrupt():
        wait_for(lambda: (out / hub.PARTS_DIR).is_dir() and kept_bytes(out) >= 100, 3.0)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        hub.fetch(srv.url, out, progress=False)
    assert kept_bytes(out) == 100
    again = hub.fetch(srv.url, out, progress=False)
    assert again["vision_bytes_fetched_this_run"] == again["vision_bytes"] - 100
    same_weights(loaded(out), wts)


def test_a_killed_fetch_keeps_the_bytes_that_arrived(small, tmp_path):
    root, srv, wts = small
    stall_after_first_bytes(root, srv, tmp_path, 100, seconds=15.0)  # the request is in flight when killed
    out = tmp_path / "v"
    code = "import sys; from moonvit_kernels import hub; hub.fetch(sys.argv[1], sys.argv[2], progress=False)"
    env = {**os.environ, "PYTHONPATH": str(Path(moonvit_kernels.__file__).parents[1])}
    child = subprocess.Popen([sys.executable, "-c", code, srv.url, str(out)], env=env)
    try:
        wait_for(lambda: (out / hub.PARTS_DIR).is_dir() and kept_bytes(out) >= 100, 8.0)
    finally:
        child.kill()  # SIGKILL: no handler, no finally runs
        child.wait()
    assert kept_bytes(out) == 100
    again = hub.fetch(srv.url, out, progress=False)
    assert again["vision_bytes_fetched_this_run"] == again["vision_bytes"] - 100
    same_weights(loaded(out), wts)


def test_the_timeout_is_the_only_limit_on_a_slow_request(small, tmp_path, monkeypatch):
    """aiohttp gives up on any request after a total of 5 minutes unless told otherwise (`--timeout 1000`
    died at 301 s); here that total is 1 s, and a request that pauses 1.5 s (under --timeout 5) completes."""
    import aiohttp
    from fsspec.implementations.http import HTTPFileSystem

    root, srv, wts = small
    monkeypatch.setattr(aiohttp.client, "DEFAULT_TIMEOUT", aiohttp.ClientTimeout(total=1.0))
    HTTPFileSystem.clear_instance_cache()  # a session made before the patch would keep the real default
    stall_after_first_bytes(root, srv, tmp_path, 100, seconds=1.5)
    srv.stall_resumes = True
    manifest = hub.fetch(srv.url, tmp_path / "v", progress=False, timeout=5)
    assert manifest["vision_bytes_fetched_this_run"] == manifest["vision_bytes"]
    same_weights(loaded(tmp_path / "v"), wts)
