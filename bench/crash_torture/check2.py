"""2-rank load of a rank-local checkpoint: check2.py DIR RANK PORT OUT"""
import os, sys, json, datetime
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import *
import torch.distributed as tdist
d, rank, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                         world_size=2, timeout=datetime.timedelta(seconds=60))
st = make_state(-1, "ranklocal", rank, 2)
res = {}
try:
    dcp.load(st, checkpoint_id=d)
    res["versions"] = {str(k): v[:3] for k, v in versions_of(st).items()}
except Exception as e:
    res["error"] = f"{getattr(e, 'code_name', type(e).__name__)}: {str(e)[:500]}"
json.dump(res, open(out, "w"))
