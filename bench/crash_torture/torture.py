"""torture.py SCENARIO NKILLS SEED [BASE]
Repeatedly starts child(ren) saving into one directory, SIGKILLs at random
moments, checks the directory. Results in BASE/SCENARIO-SEED/report.jsonl."""
import os, sys, json, time, random, signal, subprocess, socket, glob
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import *

scenario, nkills, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = sys.argv[4] if len(sys.argv) > 4 else os.path.join(
    os.environ.get("TMPDIR", "/tmp"), "dcp_crash_torture")
rng = random.Random(seed)
work = os.path.join(base, f"{scenario}-{seed}")
subprocess.run(["rm", "-rf", work])
os.makedirs(work)
d = os.path.join(work, "ckpt")
place_unrelated(d)
if scenario == "ranklocal":
    for r in range(2):
        os.makedirs(os.path.join(d, f"rank-{r}"), exist_ok=True)
        open(os.path.join(d, f"rank-{r}", "user.txt"), "w").write("x")
rep = open(os.path.join(work, "report.jsonl"), "a")
PY = sys.executable
ENV = dict(os.environ)  # DCP_LIBRARY, DCPPY: as the caller set them
DCPTOOL = os.environ.get("DCP_TOOL", os.path.join(
    HERE, "..", "..", "bazel-bin", "tools", "dcp"))
ever_committed = False
stats = dict(kills=0, ok=0, violations=0, journal_pending=0, nockpt_before_commit=0)


def freeport():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def parse(paths):
    ev = []
    for p in paths:
        if not os.path.exists(p):
            continue
        for line in open(p):
            parts = line.split()
            if parts:
                ev.append((p, parts))
    return ev


def session_pids(sid):
    pids = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                s = open(f"/proc/{e}/stat").read()
                fields = s[s.rindex(")") + 2:].split()
                if int(fields[3]) == sid and fields[0] != "Z":
                    pids.append(int(e))
            except Exception:
                pass
    return pids


def descendants(pid):
    kids = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                s = open(f"/proc/{e}/stat").read()
                fields = s[s.rindex(")") + 2:].split()
                if int(fields[1]) == pid:
                    kids.append(int(e))
            except Exception:
                pass
    out = list(kids)
    for k in kids:
        out += descendants(k)
    return out


def cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
    except Exception:
        return ""


run_no = 0
prev_observed = None
carry_allowed = set()
next_v = 1
logs_all = []


def start_children():
    global run_no
    run_no += 1
    procs = []
    if scenario in ("ranklocal", "hf_dist"):
        port = freeport()
        lp = [os.path.join(work, f"log{run_no}.r{r}") for r in range(2)]
        p0 = subprocess.Popen([PY, os.path.join(HERE, "child.py"), scenario, d, str(next_v), lp[0], "0", "2", str(port)],
                              env=ENV, start_new_session=True, stdout=open(lp[0] + ".out", "w"), stderr=subprocess.STDOUT)
        p1 = subprocess.Popen([PY, os.path.join(HERE, "child.py"), scenario, d, str(next_v), lp[1], "1", "2", str(port)],
                              env=ENV, start_new_session=True, stdout=open(lp[1] + ".out", "w"),
                              stderr=subprocess.STDOUT)
        procs = [p0, p1]
    elif scenario == "concurrent":
        lp = [os.path.join(work, f"log{run_no}.a"), os.path.join(work, f"log{run_no}.b")]
        p0 = subprocess.Popen([PY, os.path.join(HERE, "child.py"), scenario, d, str(next_v), lp[0]],
                              env=ENV, start_new_session=True, stdout=open(lp[0] + ".out", "w"), stderr=subprocess.STDOUT)
        p1 = subprocess.Popen([PY, os.path.join(HERE, "child.py"), scenario, d, str(next_v + 1000000), lp[1]],
                              env=ENV, start_new_session=True, stdout=open(lp[1] + ".out", "w"),
                              stderr=subprocess.STDOUT)
        procs = [p0, p1]
    else:
        lp = [os.path.join(work, f"log{run_no}")]
        p0 = subprocess.Popen([PY, os.path.join(HERE, "child.py"), scenario, d, str(next_v), lp[0]],
                              env=ENV, start_new_session=True, stdout=open(lp[0] + ".out", "w"), stderr=subprocess.STDOUT)
        procs = [p0]
    logs_all.extend(lp)
    return procs, lp


def save_time_estimate():
    ts = {}
    durs = []
    for p, parts in parse(logs_all):
        if parts[0] == "S":
            ts[(p, parts[1])] = float(parts[2])
        elif parts[0] == "D" and (p, parts[1]) in ts:
            durs.append(float(parts[2]) - ts[(p, parts[1])])
    durs = durs[-20:]
    return sum(durs) / len(durs) if durs else 0.2


def allowed_versions(lp_run):
    """last committed version (over all history) + versions in flight in this run."""
    allowed = set()
    for group in (["a"], ["b"]) if scenario == "concurrent" else ([None],):
        last_d = None
        for p, parts in parse(logs_all):
            if scenario == "concurrent" and not p.endswith("." + group[0]):
                continue
            if parts[0] == "D":
                last_d = int(parts[1]) if last_d is None else max(last_d, int(parts[1]))
        if scenario != "concurrent" and not any(parts[0] == "D" for _, parts in parse(lp_run)):
            if prev_observed is not None:
                last_d = prev_observed
            elif carry_allowed:
                allowed |= carry_allowed
                last_d = max(carry_allowed)
        if scenario == "concurrent" and prev_observed is not None:
            allowed.add(prev_observed)
        if last_d is not None:
            allowed.add(last_d)
        for p, parts in parse(lp_run):
            if scenario == "concurrent" and not p.endswith("." + group[0]):
                continue
            if parts[0] == "S" and (last_d is None or int(parts[1]) > last_d):
                allowed.add(int(parts[1]))
    return allowed


def max_started():
    m = 0
    for p, parts in parse(logs_all):
        if parts[0] in ("S",):
            m = max(m, int(parts[1]) % 1000000)
    return m


def load_check():
    res = {}
    if scenario == "ranklocal":
        port = freeport()
        outs = [os.path.join(work, f"chk.r{r}.json") for r in range(2)]
        for o in outs:
            if os.path.exists(o):
                os.remove(o)
        ps = [subprocess.Popen([PY, os.path.join(HERE, "check2.py"), d, str(r), str(port), outs[r]], env=ENV,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for r in range(2)]
        for p in ps:
            p.wait(timeout=120)
        rs = [json.load(open(o)) if os.path.exists(o) else {"error": "checker died"} for o in outs]
        errs = [r["error"] for r in rs if "error" in r]
        if errs:
            return {"error": " | ".join(errs)}
        vs = {}
        for r in rs:
            for k, names in r["versions"].items():
                vs.setdefault(k, names)
        return {"versions": vs}
    tmpl = make_state(-1, "hf" if scenario == "hf_dist" else scenario)
    try:
        dcp.load(tmpl, **reader_kw(scenario, d))
        res["versions"] = {str(k): v[:3] for k, v in versions_of(tmpl).items()}
    except Exception as e:
        res["error"] = f"{getattr(e, 'code_name', type(e).__name__)}: {str(e)[:600]}"
    return res


def check(lp_run, what):
    global ever_committed, prev_observed, carry_allowed
    for p, parts in parse(logs_all):
        if parts[0] == "D":
            ever_committed = True
    allowed = allowed_versions(lp_run)
    lst = listing(d)
    res = load_check()
    vr = subprocess.run([DCPTOOL, "verify", d], capture_output=True, text=True, timeout=120)
    journal = [n for n, _ in lst if n in (".dcp-hf-commit", ".dcp-mega-commit")]
    if journal:
        stats["journal_seen"] = stats.get("journal_seen", 0) + 1
    viol = []
    if "error" in res:
        prev_observed = None
        carry_allowed = set(allowed)
        if journal:
            stats["journal_pending"] += 1
            viol.append("load refused: commit journal pending")
        elif ever_committed:
            viol.append("load failed after a committed save")
        else:
            stats["nockpt_before_commit"] += 1
    else:
        vs = res["versions"]
        ints = [int(k) for k in vs if k != "nonuniform"]
        if "nonuniform" in vs or len(ints) != 1:
            viol.append(f"mixed versions {sorted(vs)}")
        elif ints[0] not in allowed:
            viol.append(f"version {ints[0]} not in allowed {sorted(allowed)}")
        if len(ints) == 1:
            prev_observed = ints[0]
            carry_allowed = set()
    if vr.returncode != 0 and (ever_committed or "error" not in res):
        viol.append(f"dcp verify rc={vr.returncode}")
    rec = dict(run=run_no, what=what, allowed=sorted(allowed), load=res,
               verify_rc=vr.returncode, verify_out=(vr.stdout + vr.stderr)[-600:],
               listing=lst, violations=viol)
    if viol:
        only_journal = all(x.startswith("load refused: commit journal") or x.startswith("dcp verify") for x in viol) and journal
        if not only_journal:
            stats["violations"] += 1
        rec["only_journal"] = bool(only_journal)
        snaps = glob.glob(os.path.join(work, "snap_*"))
        if len(snaps) < 6:
            sp = os.path.join(work, f"snap_{run_no}")
            subprocess.run(["cp", "-a", d, sp])
            rec["snapshot"] = sp
        rep.write(json.dumps(rec) + "\n"); rep.flush()
        print("VIOLATION", json.dumps(rec)[:1500], flush=True)
    else:
        stats["ok"] += 1
    return viol


def count(lp, kind):
    return sum(1 for _, parts in parse(lp) if parts[0] == kind)


def wait_gone(sid, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not session_pids(sid):
            return True
        time.sleep(0.01)
    return False


t_start = time.time()
if scenario == "async_process_wk":
    # one long-lived child; kill only its writer process
    procs, lp = start_children()
    child = procs[0]
    while stats["kills"] < nkills:
        n0 = count(lp, "S")
        k = rng.randint(1, 3)
        t0 = time.time()
        while count(lp, "S") < n0 + k and time.time() - t0 < 120:
            time.sleep(0.002)
        est = save_time_estimate()
        delay = rng.uniform(0, 0.003) if rng.random() < 0.3 else rng.uniform(0, est * 1.3)
        time.sleep(delay)
        writers = [p for p in descendants(child.pid) if "resource_tracker" not in cmdline(p)]
        if not writers:
            continue
        for w in writers:
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stats["kills"] += 1
        vkill = max_started()
        # wait for the child to report the outcome of that save
        t0 = time.time()
        outcome = None
        while time.time() - t0 < 120:
            for _, parts in parse(lp):
                if parts[0] in ("D", "P") and int(parts[1]) >= vkill:
                    outcome = parts[0]
            if outcome:
                break
            time.sleep(0.005)
        if outcome == "P":
            pv = [int(parts[1]) for _, parts in parse(lp) if parts[0] == "P"][-1]
            check(lp, f"writer killed during v{pv} delay={delay:.4f}")
            open(f"{lp[0]}.go{pv}", "w").close()
        elif outcome is None:
            print("child stuck after writer kill", flush=True)
            rep.write(json.dumps(dict(what="child stuck after writer kill", v=vkill)) + "\n")
            break
    os.killpg(child.pid, signal.SIGKILL)
    wait_gone(child.pid)
else:
    while stats["kills"] < nkills:
        next_v = max_started() + 1
        procs, lp = start_children()
        sid = procs[0].pid
        k = rng.randint(1, 4)
        t0 = time.time()
        while count(lp, "S") < k * len(procs) and time.time() - t0 < 120:
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.002)
        est = save_time_estimate()
        r = rng.random()
        if r < 0.25:
            delay = rng.uniform(0, 0.003)
        else:
            delay = rng.uniform(0, est * 1.4)
        time.sleep(delay)
        if scenario == "async_process" and rng.random() < 0.7:
            what = "killed training process only"
            os.kill(procs[0].pid, signal.SIGKILL)
        else:
            what = "killpg"
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()
        for p in procs:
            if not wait_gone(p.pid, 30):
                left = session_pids(p.pid)
                rep.write(json.dumps(dict(what="processes survive 30s after kill", pids=[(x, cmdline(x)) for x in left])) + "\n")
                print("LINGER", [(x, cmdline(x)) for x in left], flush=True)
                os.killpg(p.pid, signal.SIGKILL)
                wait_gone(p.pid, 10)
        stats["kills"] += 1
        check(lp, f"{what} k={k} delay={delay:.4f} est={est:.3f}")
        if stats["kills"] % 10 == 0:
            print(scenario, stats, f"{time.time()-t_start:.0f}s", flush=True)

# gather leftover / failure lines
fails, lefts = [], []
for p, parts in parse(logs_all):
    if parts[0] == "F":
        fails.append((os.path.basename(p), " ".join(parts[:3])))
    if parts[0] in ("L", "LERR"):
        lefts.append((os.path.basename(p), " ".join(parts)[:800]))
nd = sum(1 for _, parts in parse(logs_all) if parts[0] == "D")
summary = dict(scenario=scenario, seed=seed, stats=stats, saves_done=nd,
               fails=len(fails), fail_samples=fails[:8], fail_codes=sorted({f[1].split()[2] for f in fails}),
               leftover_reports=len(lefts), leftover_samples=lefts[:5], secs=round(time.time() - t_start))
rep.write(json.dumps(dict(summary=summary)) + "\n")
print("SUMMARY", json.dumps(summary), flush=True)
