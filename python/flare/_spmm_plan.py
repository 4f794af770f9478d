"""flare.sparse.SpmmPlan: Y = A X on the GPU for one sparse matrix A and any number of X, over
A's CSR form (flare/sparse/spmm_gpu.h), a hyb(c, k) decomposition (flare/sparse/hyb_gpu.h), or
whichever of those runs fastest (format="auto"); schedules from the auto-tuner
(flare/sparse/spmm_tune.h)."""

import numpy as np

from . import _flare
from ._sparse_args import _csr_arrays, _gpu_operand
from ._tensors import arg, is_cuda, is_torch, torch_module

# The decompositions format="auto" times next to CSR: hyb(1, 4) won on the power-law graphs at
# d 32 and hyb(4, 6) on the uniform one at d >= 128 (H100, docs/perf.md).
AUTO_HYB = ((1, 4), (4, 6))


def _host_array(x, dtype):
    """A numpy copy (or view) of an index / value array given as numpy or torch (any device)."""
    if is_torch(x):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(x, dtype=dtype)


class _DeviceLayout:
    """A decomposition on the GPU (flare/sparse/hyb_gpu.h, bsr_gpu.h): its layout, built on the
    host, with the layout's index arrays on `device` and, per dtype, its value arrays gathered
    from A's values by the layout's source arrays (`sources`: value array name -> source array
    name; -1 gives 0)."""

    def __init__(self, layout, device, sources):
        torch = torch_module()
        self.layout = layout
        raw = layout.arrays()

        def on_device(name, dtype):
            host = np.frombuffer(raw[name], dtype=dtype).copy()
            return torch.from_numpy(host).to(device)

        self.arrays = {name: on_device(name, np.int32) for name in raw
                       if name not in sources.values()}
        self._sources = {value: on_device(source, np.int64) for value, source in sources.items()}
        self._values = {}

    def arrays_for(self, values):
        """The device arrays with the values of `values` (A's, in one dtype)."""
        key = values.dtype
        if key not in self._values:
            torch = torch_module()
            gathered = {}
            for name, source in self._sources.items():
                if values.numel() == 0:
                    gathered[name] = torch.zeros(source.shape, dtype=values.dtype,
                                                 device=values.device)
                else:
                    picked = values[source.clamp(min=0)]
                    gathered[name] = torch.where(source >= 0, picked,
                                                 torch.zeros_like(picked)).contiguous()
            self._values[key] = {**self.arrays, **gathered}
        return self._values[key]


def _device_hyb(rows, cols, arrays, device, c, k):
    indptr, indices = (_host_array(x, np.int32) for x in arrays[:2])
    layout = _flare.sparse_hyb_gpu_layout(rows, cols, arg(indptr), arg(indices), int(c), int(k))
    return _DeviceLayout(layout, device, {"ell_values": "ell_source",
                                          "rest_values": "rest_source"})


def _device_bsr(rows, cols, arrays, device, min_fill):
    indptr, indices = (_host_array(x, np.int32) for x in arrays[:2])
    layout = _flare.sparse_bsr_gpu_layout(rows, cols, arg(indptr), arg(indices),
                                          arg(_host_array(arrays[2], np.float32)),
                                          float(min_fill))
    return _DeviceLayout(layout, device, {"values": "source", "rest_values": "rest_source"})


class SpmmPlan:
    """Y = A X on the GPU for one sparse matrix A and any number of X. A's arrays are moved to
    `device` once (int32 indices; values in each X's dtype, converted once per dtype), and each
    feature size and dtype gets a schedule at its first run(): with tune=True the auto-tuner's
    (every candidate timed on the device, the choice cached on disk under the JIT cache
    directory by A's structure, d, dtype and GPU; that first run synchronizes and cannot be
    captured in a CUDA graph: run once before capturing), else the default. Later runs only
    launch (CUDA-graph safe). A plan keeps one workspace per format and feature size: one run at
    a time (not from two streams at once).

    A: as flare.sparse.spmm's (torch sparse CSR / COO or a triple with `shape`); cache=False
    skips the disk cache (always search). format:
      "csr": the merge-path kernels on A's CSR arrays (schedules: feature tiles, chunk size);
      "hyb": over the hyb(c, k) decomposition `hyb` = (c, k) (built on the host here, which
        validates A; per column partition one launch over its ELL buckets plus its CSR
        remainder; 16-bit results rounded once per partition; schedules: feature tiles, slots
        an ELL warp takes);
      "bsr": blocks of 16 x 16 holding at least `bsr_min_fill` of their slots on tensor cores,
        the other nonzeros through a CSR remainder (flare/sparse/bsr_gpu.h: float16 / bfloat16
        X, d a multiple of 32, X and out 16-byte aligned; decomposed on the host here; no
        schedule to tune);
      "auto": the first run of each (d, dtype) tunes "csr" and each hyb of `auto_hyb` (default
        AUTO_HYB: their decompositions built then, on the host: up to about a second each for
        23M nonzeros) and keeps the fastest (format_timings_us in schedule()), the choice
        cached on disk by A's structure, d, dtype and GPU like the schedules (a later plan
        builds and tunes only the chosen format: format_from_cache in schedule()); with
        tune=False, "csr" with its default schedule."""

    def __init__(self, A, device=None, shape=None, tune=True, cache=True, format="csr",
                 hyb=(1, 5), auto_hyb=AUTO_HYB, bsr_min_fill=0.5, where="flare.sparse.SpmmPlan"):
        torch = torch_module()
        self.device = torch.device(device) if device is not None else torch.device(
            "cuda", torch.cuda.current_device())
        if self.device.type != "cuda":
            raise ValueError(f"{where}: device must be a CUDA device, got {self.device}")
        if format not in ("csr", "hyb", "bsr", "auto"):
            raise ValueError(f"{where}: format must be 'csr', 'hyb', 'bsr' or 'auto', got "
                             f"{format!r}")
        rows, cols, arrays, _ = _csr_arrays(A, shape, where)
        if arrays[2] is None:
            raise ValueError(f"{where}: A needs values")
        self.rows, self.cols = int(rows), int(cols)
        self.format = format
        self.tune, self.cache = bool(tune), bool(cache)
        self._arrays = arrays  # for the decompositions format="auto" builds at its first run
        # The formats this plan runs: "csr" and (c, k) of each hyb.
        self._formats = {"csr": ["csr"], "hyb": [tuple(int(v) for v in hyb)], "bsr": ["bsr"],
                         "auto": ["csr"] + [tuple(int(v) for v in h) for h in auto_hyb]}[format]
        self._hybs = {}
        if format == "hyb":
            self._hybs[self._formats[0]] = _device_hyb(self.rows, self.cols, arrays, self.device,
                                                       *self._formats[0])
        self._bsr = (_device_bsr(self.rows, self.cols, arrays, self.device, bsr_min_fill)
                     if format == "bsr" else None)
        self._indptr, self._indices = (
            torch.as_tensor(x).to(device=self.device, dtype=torch.int32).contiguous()
            for x in arrays[:2])
        self._values_given = torch.as_tensor(arrays[2]).to(device=self.device)
        self._values, self._workspaces, self._schedules, self._chosen = {}, {}, {}, {}
        self._structure_hash = None
        # run()'s errors: the plan's method, or the caller's name for a one-call plan (spmm).
        self._run_where = f"{where}.run" if where == "flare.sparse.SpmmPlan" else where

    def schedule(self, d, dtype):
        """The schedule of feature size d and dtype, None before its first run: a dict with
        format ("csr" or "hyb(c, k)"), feature_tile, and chunk_items ("csr") or slots_per_warp
        ("hyb"); for a tuned one from_cache, search_ms and timings_us as (tile, chunk or slots,
        us); for format="auto" also format_timings_us (each format's tuned time) or
        format_from_cache."""
        key = (int(d), dtype)
        chosen = self._chosen.get(key)
        if chosen is None:
            return None
        return self._schedules[(chosen,) + key]

    def run(self, X, out=None):
        """Y = A X in X's dtype (float16 / bfloat16 / float32 kept, others as float32) on torch's
        current stream; into `out` ([rows, d], X's kernel dtype, unit stride along d) when
        given."""
        torch = torch_module()
        where = self._run_where
        if not is_cuda(X) or X.device != self.device:
            raise ValueError(f"{where}: X must be a CUDA tensor on {self.device}, got "
                             f"{getattr(X, 'device', type(X).__name__)}")
        if X.ndim != 2 or X.shape[0] != self.cols:
            raise ValueError(f"{where}: X must have shape [cols = {self.cols}, d], got "
                             f"{list(X.shape)}")
        x = _gpu_operand(X, "X", where)
        d = x.shape[1]
        if out is None:
            out = torch.empty((self.rows, d), dtype=x.dtype, device=self.device)
        elif (not is_cuda(out) or out.device != self.device or out.dtype != x.dtype
              or tuple(out.shape) != (self.rows, d)):
            raise ValueError(f"{where}: out must be a {x.dtype} [{self.rows}, {d}] tensor on "
                             f"{self.device}, got {getattr(out, 'dtype', None)} "
                             f"{list(getattr(out, 'shape', []))}")
        values = self._values.get(x.dtype)
        if values is None:
            values = self._values[x.dtype] = self._values_given.to(x.dtype).contiguous()
        key = (d, x.dtype)
        chosen = self._chosen.get(key)
        if chosen is not None:
            self._launch(chosen, x, values, out)
            return out
        if self.tune:
            self._refuse_capture(d, x.dtype)
        if len(self._formats) == 1 or not self.tune:
            chosen = self._formats[0]
            self._launch(chosen, x, values, out)  # a tuned first run searches
        else:
            chosen = self._cached_format(x)
            if chosen is None:
                chosen = self._choose_format(x, values, out)
            else:
                self._launch(chosen, x, values, out)  # its schedule: cached or searched
                self._schedules[(chosen,) + key]["format_from_cache"] = True
        self._chosen[key] = chosen
        return out

    def _format_key(self, x):
        """The disk cache's key of the format choice for x's d and dtype (A's structure hash is
        computed once: a copy of its index arrays, which synchronizes)."""
        if self._structure_hash is None:
            self._structure_hash = _flare.sparse_csr_structure_hash(
                self.rows, self.cols, self._indptr, self._indices)
        return _flare.sparse_spmm_format_key(self._structure_hash, x)

    def _cached_format(self, x):
        """The cached format choice for x's d and dtype when it is among this plan's formats."""
        if not self.cache:
            return None
        name = _flare.sparse_read_spmm_format(self._format_key(x))
        for candidate in self._formats:
            if _format_file_name(candidate) == name:
                return candidate
        return None

    def _choose_format(self, x, values, out):
        """format="auto": each format tuned, then timed (3 runs after one), the fastest kept;
        out holds A X from it."""
        torch = torch_module()
        times = {}
        for name in self._formats:
            self._launch(name, x, values, out)  # the format's schedule search
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(3):
                self._launch(name, x, values, out)
            end.record()
            end.synchronize()
            times[name] = 1e3 * start.elapsed_time(end) / 3
        chosen = min(times, key=times.get)
        key = (x.shape[1], x.dtype)
        self._schedules[(chosen,) + key]["format_timings_us"] = {
            _format_name(name): us for name, us in times.items()}
        if self.cache:
            _flare.sparse_write_spmm_format(self._format_key(x), _format_file_name(chosen))
        for name in self._formats:  # the decompositions not chosen free their device arrays
            if name != chosen and name in self._hybs and not any(
                    c == name for c in self._chosen.values()):
                del self._hybs[name]
        self._launch(chosen, x, values, out)
        return chosen

    def _launch(self, name, x, values, out):
        """out <- A x by format `name` with its schedule of (d, dtype), searched (or read from the
        disk cache) at the first launch when tuning."""
        torch = torch_module()
        d = x.shape[1]
        key = (name, d, x.dtype)
        workspace = self._workspaces.get((name, d))
        if name == "bsr":  # one schedule: nothing to tune
            if workspace is None:
                workspace = self._workspaces[(name, d)] = torch.empty(
                    max(self._bsr.layout.workspace_bytes(d), 16), dtype=torch.uint8,
                    device=self.device)
            self._schedules.setdefault(key, {"format": "bsr", "blocks": self._bsr.layout.blocks,
                                             "padding_ratio": self._bsr.layout.padding_ratio})
            _flare.sparse_spmm_bsr_cuda(self._bsr.layout, self._bsr.arrays_for(values), x, out,
                                        workspace)
            return
        if name == "csr":
            if workspace is None:  # torch's caching allocator: a later graph keeps it
                workspace = self._workspaces[(name, d)] = torch.empty(
                    _flare.sparse_spmm_workspace_bytes(self.rows, self._indices.shape[0], d),
                    dtype=torch.uint8, device=self.device)
            arrays = (self.rows, self.cols, self._indptr, self._indices, values, x, out,
                      workspace)
            tune, launch, default = (_flare.sparse_spmm_tune, _flare.sparse_spmm_cuda,
                                     lambda: _flare.sparse_spmm_schedules(d)[0])
            second = "chunk_items"
        else:
            hyb = self._hybs.get(name)
            if hyb is None:
                hyb = self._hybs[name] = _device_hyb(self.rows, self.cols, self._arrays,
                                                     self.device, *name)
            if workspace is None:
                workspace = self._workspaces[(name, d)] = torch.empty(
                    max(hyb.layout.workspace_bytes(d), 16), dtype=torch.uint8,
                    device=self.device)
            arrays = (hyb.layout, hyb.arrays_for(values), x, out, workspace)
            tune, launch, default = (_flare.sparse_spmm_hyb_tune, _flare.sparse_spmm_hyb_cuda,
                                     lambda: _flare.sparse_hyb_default_schedule(d))
            second = "slots_per_warp"
        schedule = self._schedules.get(key)
        if schedule is None and self.tune:
            schedule = self._schedules[key] = tune(*arrays, use_cache=self.cache)
            schedule["format"] = _format_name(name)
            return  # the search left A X from the chosen schedule in out
        if schedule is None:
            tile, number = default()
            schedule = self._schedules[key] = {"format": _format_name(name),
                                               "feature_tile": tile, second: number}
        launch(*arrays, schedule["feature_tile"], schedule[second])

    def _refuse_capture(self, d, dtype):
        if torch_module().cuda.is_current_stream_capturing():
            raise RuntimeError(f"{self._run_where}: the first run of feature size {d} in {dtype} "
                               "tunes the schedule on the device and cannot be captured in a "
                               "CUDA graph: run once before capturing (or tune=False)")


def _format_name(name):
    return name if isinstance(name, str) else f"hyb({name[0]}, {name[1]})"


def _format_file_name(name):
    """A format as the disk cache stores it (flare/sparse/spmm_tune.h's read_spmm_format)."""
    return name if isinstance(name, str) else f"hyb:{name[0]}:{name[1]}"
