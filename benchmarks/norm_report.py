"""The tables and the summary of norm_bench.py: the wide per-shape table against the
peers, the heuristic-against-forced-modes table, and the closing summary lines."""

from __future__ import annotations

LABELS = {"static_persistent": "persistent", "multi_wave_reload": "mw_reload", "multi_wave_cached": "mw_cached"}
HEURISTIC_TOLERANCE = 3.0  # % the heuristic may trail the best mode


def _wide_rows(recs, peers, with_dtype: bool):
    """One display row per (shape, dtype, phase) from the per-impl records."""
    rows = {}
    for r in recs:
        key = (r["shape"], r["dtype"], r["phase"])
        row = rows.setdefault(key, {"shape": r["shape"], "dtype": r["dtype"], "phase": r["phase"], "copy": r["copy"]})
        if not with_dtype:
            row.pop("dtype", None)
        row[LABELS.get(r["impl"], r["impl"])] = "=" if r.get("same_as") else r.get("gbps")
        if r["impl"] == "rtcnorm":
            row["rtc_us"] = r["ms"] * 1e3 if r.get("ms") else None
            row["kern_us"] = r.get("kern_us")
        elif r.get("kern_us") is not None:
            row[f"kern_us_{r['impl']}"] = r["kern_us"]
        if r.get("check"):
            row["notes"] = (row.get("notes", "") + f" {r['impl']}!").strip()
    for key, group in _group(recs).items():
        row = rows[key]
        cands = [(r["gbps"], r["impl"]) for r in group if r["impl"] in peers and r.get("gbps") and not r.get("check")]
        if cands:
            best, name = max(cands)
            row["best_peer"], row["peer"] = best, name
            rtc = row.get("rtcnorm")
            row["rtc/best"] = rtc / best if isinstance(rtc, float) else None
        # kern_us is None or finite (measure stores no NaN), so min() is well defined.
        kcands = [
            (r["kern_us"], r["impl"]) for r in group if r["impl"] in peers and r.get("kern_us") and not r.get("check")
        ]
        if kcands:
            best, name = min(kcands)
            row["peer_kern_us"], row["kpeer"] = best, name
            rtc = row.get("kern_us")
            row["kern best/rtc"] = best / rtc if rtc else None
    return list(rows.values())


def _heuristic_rows(recs, plans, modes):
    out = []
    for (shape, dname, ph), rows in _group(recs).items():
        got = {r["impl"]: r.get("gbps") for r in rows if isinstance(r.get("gbps"), float)}
        measured = {md: got[md] for md in modes if md in got}
        if len(measured) < 2 or "rtcnorm" not in got:
            continue
        best = max(measured, key=measured.get)
        chosen = plans.get((shape, dname), {}).get(None, {}).get("mode", "?")
        # When the heuristic picks the best mode it launches that very kernel:
        # the two columns differ only by timing noise, so the gap is zero.
        gap = 0.0 if chosen == best else 100 * (measured[best] - got["rtcnorm"]) / measured[best]
        row = {"shape": shape, "dtype": dname, "phase": ph, "heuristic": chosen, "rtcnorm": got["rtcnorm"]}
        row.update(best_mode=best, best=measured[best], gap_pct=max(gap, 0.0))
        kern = {r["impl"]: r["kern_us"] for r in rows if r.get("kern_us")}
        kmodes = {md: kern[md] for md in modes if md in kern}
        if "rtcnorm" in kern and len(kmodes) >= 2:
            kbest = min(kmodes, key=kmodes.get)
            kgap = 0.0 if chosen == kbest else 100 * (kern["rtcnorm"] - kmodes[kbest]) / kmodes[kbest]
            row.update(kern_us=kern["rtcnorm"], kern_best_mode=kbest, kern_best_us=kmodes[kbest])
            row["kern_gap_pct"] = max(kgap, 0.0)
            gap = kgap
        out.append({**row, "ok": "ok" if gap <= HEURISTIC_TOLERANCE else "MISS"})
    return out


def _group(recs) -> dict:
    groups: dict = {}
    for r in recs:
        groups.setdefault((r["shape"], r["dtype"], r["phase"]), []).append(r)
    return groups


def _summary(op, a, recs, issues, heur, wide, meta, saved, seconds) -> None:
    print(f"\n{op}: {len(recs)} measurements in {seconds:.0f} s; peers: ", end="")
    print("; ".join(f"{k} {v}" for k, v in meta["peers"].items()) or "none")
    seen: dict = {}
    for impl, ph, why in issues:
        seen.setdefault((impl, why), []).append(ph)
    for (impl, why), phs in list(seen.items())[:12]:
        print(f"  {impl} ({len(phs)}x {'/'.join(sorted(set(phs)))}): {why}")
    if len(seen) > 12:
        print(f"  ... {len(seen) - 12} more kinds of failure in {a.out}_records.json")
    misses = [r for r in heur.rows if r["ok"] != "ok"]
    if heur.rows:
        key = "kern_gap_pct" if all("kern_gap_pct" in r for r in heur.rows) else "gap_pct"
        worst = max(heur.rows, key=lambda r: r[key])
        what = "kernel time" if key == "kern_gap_pct" else "per call"
        print(f"heuristic within {HEURISTIC_TOLERANCE:.0f}% of the best mode ({what}): ", end="")
        print(
            f"{len(heur.rows) - len(misses)}/{len(heur.rows)}; worst {worst['shape']} {worst['phase']} {worst[key]:.1f}%"
        )
    _ratio_line(wide.rows, "rtc/best", "peer", "rtcnorm >= best peer", a.dtype)
    _ratio_line(wide.rows, "kern best/rtc", "kpeer", "kernel time: rtcnorm <= best peer", a.dtype)
    print("saved: " + ", ".join(saved), flush=True)


def _ratio_line(rows, key: str, peer_key: str, label: str, dtype: str) -> None:
    """'<label> on X/Y rows; worst ...' over the rows where `key` (rtcnorm against
    the best peer, >= 1 where rtcnorm leads) was measured."""
    ratios = [r for r in rows if isinstance(r.get(key), float)]
    if not ratios:
        return
    worst = min(ratios, key=lambda r: r[key])
    beat = sum(r[key] >= 1.0 for r in ratios)
    where = f"{worst['shape']} {worst.get('dtype', dtype)} {worst['phase']}"
    print(f"{label} on {beat}/{len(ratios)} rows; worst {where} x{worst[key]:.2f} vs {worst[peer_key]}")
