"""The charts of benches/results/<scenario>.svg, written as SVG text by hand
(standard library only): a bar per row for the closed-loop scenarios,
goodput against capacity for overload, a time line per run for failover."""

from __future__ import annotations

import html
import math

from .common import (
    KIND_ARTICLE,
    KIND_CEILING,
    KIND_DEFAULT,
    KIND_FLOOR,
    KIND_GATEWAY,
    KIND_TUNED,
    fmt_ms,
    fmt_rate,
    fmt_share,
)


BAR_COLOURS = {
    KIND_GATEWAY: "#d9480f",
    KIND_CEILING: "#868e96",
    KIND_FLOOR: "#adb5bd",
    KIND_TUNED: "#1c7ed6",
    KIND_DEFAULT: "#38d9a9",
    KIND_ARTICLE: "#a5d8ff",
}


def svg_chart(scenario, rows, subtitles):
    """A horizontal bar per row: 2xx req/s, annotated with p99."""
    label_w, bar_w, note_w, row_h = 250, 470, 230, 24
    top = 46 + 16 * len(subtitles)
    width = label_w + bar_w + note_w
    height = top + row_h * len(rows) + 50
    peak = max([r.get("rps") or 0 for r in rows] + [1])
    parts = svg_head(scenario, subtitles, width, height)
    show_connections = len({r["connections"] for r in rows}) > 1
    for i, row in enumerate(rows):
        parts.extend(svg_row(row, top + i * row_h, label_w, bar_w, row_h, peak, show_connections))
    parts.append(svg_legend(rows, top + row_h * len(rows) + 25))
    return "\n".join([*parts, "</svg>"]) + "\n"


def svg_row(row, y, label_w, bar_w, row_h, peak, show_connections):
    label = row["variant"] + (f"  c={row['connections']}" if show_connections else "")
    parts = [svg_text(label_w - 8, y + row_h / 2 + 4, label, anchor="end")]
    if row["status"] != "ok":
        return parts + [svg_failed(row, label_w, y, row_h)]
    length = max(1.0, bar_w * row["rps"] / peak)
    parts.append(
        f'<rect x="{label_w}" y="{y + 4}" width="{length:.1f}" height="{row_h - 8}" fill="{BAR_COLOURS[row["kind"]]}"/>'
    )
    note = f"{fmt_rate(row['rps'])} req/s · p99 {fmt_ms(row['p99_ms'])}"
    if "upstream_rps" in row:
        note += f" · A {fmt_rate(row['upstream_rps'])}/s"
    return parts + [svg_text(label_w + length + 6, y + row_h / 2 + 4, note)]


def svg_runs(parts, rows, top, label_w, row_h):
    """Labels each run "variant #run" in parts, and the failed ones with their
    error; yields (y, row) of the others, for the caller to draw."""
    for i, r in enumerate(rows):
        y = top + i * row_h
        parts.append(svg_text(label_w - 8, y + row_h / 2 + 4, f"{r['variant']} #{r['run']}", anchor="end"))
        if r["status"] != "ok":
            parts.append(svg_failed(r, label_w, y, row_h))
            continue
        yield y, r


def svg_failed(row, label_w, y, row_h):
    """A failed row's error, in red where its bar would be."""
    return svg_text(label_w + 4, y + row_h / 2 + 4, f"failed: {row['error']}"[:90], fill="#c92a2a")


def svg_text(x, y, text, size=12, anchor="start", weight="normal", fill="#212529"):
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
        f'font-weight="{weight}" fill="{fill}">{html.escape(str(text))}</text>'
    )


def svg_overload(scenario, rows, subtitles):
    """A bar per run: goodput, with A's capacity marked; annotated with the
    served p99, the share rejected and the slowest rejection."""
    label_w, bar_w, note_w, row_h = 230, 380, 420, 24
    top = 62 + 16 * len(subtitles)
    width, height = label_w + bar_w + note_w, top + row_h * len(rows) + 50
    scale = bar_w / (scenario.capacity * 1.1)
    parts = svg_head(scenario, subtitles, width, height)
    x_cap = label_w + scenario.capacity * scale
    parts.append(
        f'<line x1="{x_cap:.1f}" y1="{top - 6}" x2="{x_cap:.1f}" y2="{top + row_h * len(rows)}" '
        'stroke="#212529" stroke-dasharray="4,3"/>'
    )
    parts.append(svg_text(x_cap, top - 10, f"capacity {scenario.capacity:g}/s", size=11, anchor="middle"))
    for y, r in svg_runs(parts, rows, top, label_w, row_h):
        length = max(1.0, min(bar_w, r["goodput_rps"] * scale))
        colour = BAR_COLOURS[r["kind"]]
        parts.append(f'<rect x="{label_w}" y="{y + 4}" width="{length:.1f}" height="{row_h - 8}" fill="{colour}"/>')
        note = (
            f"{fmt_rate(r['goodput_rps'])}/s · served p99 {fmt_ms(r['served_p99_ms'])} · rejected "
            f"{fmt_share(r['rejected_share'])}, slowest {fmt_ms(r['rejected_max_ms'])}"
        )
        parts.append(svg_text(label_w + bar_w + 8, y + row_h / 2 + 4, note))
    parts.append(svg_legend(rows, top + row_h * len(rows) + 25))
    return "\n".join([*parts, "</svg>"]) + "\n"


def svg_failover(scenario, rows, subtitles):
    """A time line per run from the kill: every failed answer a red mark."""
    label_w, plot_w, note_w, row_h = 230, 500, 300, 24
    top = 62 + 16 * len(subtitles)
    width, height = label_w + plot_w + note_w, top + row_h * len(rows) + 50
    ok_rows = [r for r in rows if r["status"] == "ok"]
    before = max([r["kill_at_s"] for r in ok_rows] + [1])
    after = max([r["kill_at_s"] for r in ok_rows] + [1]) * 2
    span = before + after
    x_of = lambda t: label_w + (t + before) / span * plot_w  # noqa: E731 - t: seconds from the kill
    parts = svg_head(scenario, subtitles, width, height)
    for t in range(-math.floor(before), math.floor(after) + 1):
        x = x_of(t)
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{top + row_h * len(rows)}" stroke="#e9ecef"/>')
        parts.append(svg_text(x, top - 8, f"{t:+d} s" if t else "kill", size=10, anchor="middle"))
    parts.append(
        f'<line x1="{x_of(0):.1f}" y1="{top - 4}" x2="{x_of(0):.1f}" y2="{top + row_h * len(rows)}" stroke="#c92a2a"/>'
    )
    for y, r in svg_runs(parts, rows, top, label_w, row_h):
        parts.append(
            f'<line x1="{label_w}" y1="{y + row_h / 2}" x2="{label_w + plot_w}" y2="{y + row_h / 2}" '
            f'stroke="{BAR_COLOURS[r["kind"]]}" stroke-width="2"/>'
        )
        for ms in r["error_times_ms"]:
            parts.append(f'<circle cx="{x_of(ms / 1000):.1f}" cy="{y + row_h / 2}" r="3" fill="#c92a2a"/>')
        note = f"{r['errors']} errors ({fmt_share(r['error_share'])})"
        if r["errors"]:
            note += f", last {fmt_ms(r['last_error_ms'])} after the kill"
        parts.append(svg_text(label_w + plot_w + 8, y + row_h / 2 + 4, note))
    parts.append(svg_legend(rows, top + row_h * len(rows) + 25))
    return "\n".join([*parts, "</svg>"]) + "\n"


def svg_head(scenario, subtitles, width, height):
    return [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">'
        ),
        f'<rect width="{width}" height="{height}" fill="white"/>',
        svg_text(12, 24, f"{scenario.name}: {scenario.title}", size=16, weight="bold"),
        *(svg_text(12, 44 + 16 * i, line, size=11, fill="#495057") for i, line in enumerate(subtitles)),
    ]


def svg_legend(rows, y):
    parts = []
    kinds = [kind for kind in BAR_COLOURS if any(r["kind"] == kind for r in rows)]
    for i, kind in enumerate(kinds):
        x = 12 + i * 150
        parts.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{BAR_COLOURS[kind]}"/>')
        parts.append(svg_text(x + 18, y, kind))
    return "\n".join(parts)
