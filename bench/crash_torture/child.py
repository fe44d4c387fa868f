"""child.py SCENARIO DIR START_V LOG [RANK WORLD PORT]
Loops saving versions START_V, START_V+1, ... into DIR (overwriting)."""
import os, sys, json, time, traceback
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import *

scenario, d, v, logp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rank, world, port = 0, 1, 0
if len(sys.argv) > 5:
    rank, world, port = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
log = Log(logp)
log("PID", os.getpid(), "rank", rank)
dist = world > 1
if dist:
    import torch.distributed as tdist
    import datetime
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                             rank=rank, world_size=world,
                             timeout=datetime.timedelta(seconds=60))

async_kind = None
if scenario == "async_thread":
    async_kind = dcp.AsyncCheckpointerType.THREAD
elif scenario in ("async_process", "async_process_wk"):
    async_kind = dcp.AsyncCheckpointerType.PROCESS
stager = dcp.DefaultStager() if async_kind else None

st = make_state(v, scenario, rank, world)
extra = {}
if scenario == "ranklocal":
    extra["use_collectives"] = False

while True:
    # set every value to v
    for name, x in flat_values(st):
        if isinstance(x, torch.Tensor):
            x.fill_(v)
    if scenario not in ("hf", "hf_dist"):
        st["step"] = v
        st["note"] = f"v={v}"
    kw = writer_for(scenario, d, v, st)
    log("S", v, time.time())
    try:
        if async_kind is None:
            dcp.save(st, **kw, **extra)
        else:
            resp = dcp.async_save(st, async_checkpointer_type=async_kind,
                                  async_stager=stager, **kw)
            resp.staging_completion.result()
            log("STAGED", v, time.time())
            # the training loop changes the tensors: a value never saved
            for name, x in flat_values(st):
                if isinstance(x, torch.Tensor):
                    x.fill_(-7)
            st["step"] = -7
            resp.upload_completion.result()
    except Exception as e:
        code = getattr(e, "code_name", type(e).__name__)
        log("F", v, code, repr(str(e))[:600].replace("\n", " "))
        if scenario == "async_process_wk":
            log("P", v)
            while not os.path.exists(f"{logp}.go{v}"):
                time.sleep(0.02)
        v += 1
        continue
    log("D", v, time.time())
    if scenario != "concurrent":
        if dist:
            tdist.barrier()
        if rank == 0:
            try:
                lo = leftovers(scenario, d)
                if lo:
                    log("L", v, json.dumps(lo))
            except Exception as e:
                log("LERR", v, repr(e)[:300])
        if dist:
            tdist.barrier()
    v += 1
