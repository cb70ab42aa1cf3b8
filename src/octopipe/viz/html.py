"""The interactive timeline: one self-contained HTML file with every action of an iteration.

    save_html_timeline(result, "timeline.html", title="tuned plan")

Why inline SVG (and not a canvas): every action is an element of the page, `<rect
id="action-d{device}-{action}">`, so the file can be checked and searched without a browser,
the browser does the hit-testing for the tooltip, and tens of thousands of rectangles (a
32-device, 256-microbatch plan has 49k) still scroll and zoom smoothly. Rectangles sit in time
coordinates (`viewBox` = the iteration by the devices, stretched to the page), so zooming only
changes the drawing's width. A few lines of script, inline and offline, add the rest: the rows
fill the window's height at every size (a few devices as a few tall rows; hundreds as rows of a
few pixels, every k-th labelled, so the page opens on the whole plan at once, its fill, drain
and bubbles visible as in an overview); the critical path's outlines show where its boxes are
wide enough (outlines of boxes a pixel wide would paint their rows black); every box wide
enough for it carries its microbatch (drawn, for the boxes in view, in an overlay at screen
scale, so text is never stretched); hovering an action shows it, its device, start, end and
duration; the mouse wheel (or + and -) zooms around the pointer, dragging or scrolling pans, 0
fits the page. No network, no libraries. On a mixed cluster each row names its device's kind.

A device with data-parallel gradient all-reduces gets a thin row just below its own, one
`<rect id="reduce-d{device}-s{stage}">` per reduction; hovering one shows its stage, start, end
and duration.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

from octopipe.actions import Event
from octopipe.outfiles import write_text
from octopipe.sim import SimResult
from octopipe.units import time_unit
from octopipe.viz.layout import REDUCE_ROW, TimelineRows, timeline_rows
from octopipe.viz.style import (
    CRITICAL_EDGE,
    IDLE_COLOR,
    KIND_COLORS,
    KIND_NAMES,
    KIND_ORDER,
    REDUCE_COLOR,
    chunk_indices,
    device_label,
    events_of,
    headline,
    hex_color,
    reductions_of,
    shade,
    stage_list,
    stages_per_device,
    summarize,
)

_BAR_FILL = 0.82
_MIN_ROW_PX = 3  # rows shrink to this so that a plan of hundreds of devices fits a window


def html_timeline(
    result: SimResult | Sequence[Event],
    title: str | None = None,
    device_names: Sequence[str] | None = None,
) -> str:
    """The page, as text (see the module's docstring); `device_names`: each device's kind."""
    events = events_of(result)
    if not events:
        raise ValueError("nothing to draw: no events")
    stats = summarize(result)
    unit, scale = time_unit(stats.iteration_time)
    critical = set(result.critical_path) if isinstance(result, SimResult) else set()
    chunk_of = chunk_indices(events)
    num_chunks = 1 + max(chunk_of.values())
    P = stats.num_devices
    row_px = max(_MIN_ROW_PX, min(64, 640 // max(P, 1)))  # till the script fits the window
    span = stats.iteration_time * scale
    reductions = reductions_of(result)
    rows = timeline_rows(P, {r.device for r in reductions})

    styles = [f".i{{fill:{IDLE_COLOR}}}", f".c{{stroke:{CRITICAL_EDGE};stroke-width:1.5px}}"]
    legend = []
    kinds = [k for k in KIND_ORDER if any(e.action.kind == k for e in events)]
    for k in kinds:
        for c in range(num_chunks):
            styles.append(f".{k}{c}{{fill:{hex_color(shade(KIND_COLORS[k], c, num_chunks))}}}")
        legend.append((KIND_COLORS[k], f"{k} {KIND_NAMES[k]}"))
    if reductions:
        styles.append(f".ar{{fill:{REDUCE_COLOR}}}")
        legend.append((REDUCE_COLOR, "gradient all-reduce"))
    if num_chunks > 1:  # a chunk is the kinds' colours lightened: its chip shows them so
        legend += [
            (
                [hex_color(shade(KIND_COLORS[k], c, num_chunks)) for k in kinds],
                f"chunk {c}" + (" (lighter: later)" if c else ""),
            )
            for c in range(num_chunks)
        ]
    if critical:
        legend.append(("#FFFFFF", "critical path (outlined where boxes are wide enough)"))

    # Bars are centred on their row: the top is the centre less half the bar.
    top = [y - _BAR_FILL / 2 for y in rows.compute]
    rects = [
        f'<rect class="i" x="0" y="{y:g}" width="{span:.6g}" height="{_BAR_FILL}"/>' for y in top
    ]
    for e in events:
        a = e.action
        cls = f"{a.kind}{chunk_of[a.stage]}" + (" c" if a in critical else "")
        rects.append(
            f'<rect id="action-d{e.device}-{a}" class="{cls}" x="{e.start * scale:.7g}" '
            f'y="{top[e.device]:g}" width="{(e.end - e.start) * scale:.7g}" '
            f'height="{_BAR_FILL}"/>'
        )
    rects += _reduction_rects(reductions, rows, scale)
    labels = _row_labels(events, rows, row_px, device_names)
    chips = "".join(
        '<span class="chip">'
        + "".join(
            f'<i style="background:{c}"></i>'
            for c in (color if isinstance(color, list) else [color])
        )
        + f"{html.escape(text)}</span>"
        for color, text in legend
    )
    heading = html.escape(f"{title}: " if title else "") + html.escape(headline(stats))
    return _PAGE.format(
        title=html.escape(title or "octopipe timeline"),
        heading=heading,
        styles="\n".join(styles),
        legend=chips,
        labels=labels,
        height=f"{row_px * rows.height:g}",
        span=f"{span:.7g}",
        rows=f"{rows.height:g}",
        unit=unit,
        rects="\n".join(rects),
        count=f"{len(events)} actions"
        + (f", {len(reductions)} gradient all-reduces" if reductions else ""),
        kind_names=json.dumps({str(k): name for k, name in KIND_NAMES.items()}),
        min_row=_MIN_ROW_PX,
    )


def _reduction_rects(reductions, rows: TimelineRows, scale: float) -> list[str]:
    fill = _BAR_FILL * REDUCE_ROW
    return [
        f'<rect id="reduce-d{r.device}-s{r.stage}" class="ar" x="{r.start * scale:.7g}" '
        f'y="{rows.reduce[r.device] - fill / 2:g}" width="{(r.end - r.start) * scale:.7g}" '
        f'height="{fill:g}"/>'
        for r in reductions
    ]


def _row_labels(
    events: Sequence[Event],
    rows: TimelineRows,
    row_px: int,
    device_names: Sequence[str] | None = None,
) -> str:
    """One label per row, as tall as its row (`data-rows`: in rows, for the script that sizes
    them), so the labels line up with the drawing."""
    stages_of = stages_per_device(events)
    out = []
    for d in range(len(rows.compute)):
        out.append(
            f'<div class="lab" data-rows="1" style="height:{row_px}px">'
            + html.escape(device_label(d, device_names))
            + (f" · {stage_list(stages_of[d])}" if d in stages_of else "")
            + "</div>"
        )
        if d in rows.reduce:
            out.append(
                f'<div class="lab ar-lab" data-rows="{REDUCE_ROW:g}" '
                f'style="height:{row_px * REDUCE_ROW:g}px">device {d} all-reduce</div>'
            )
    return "".join(out)


def save_html_timeline(
    result: SimResult | Sequence[Event],
    path: str | Path,
    title: str | None = None,
    device_names: Sequence[str] | None = None,
) -> Path:
    """Write `html_timeline(result, title, device_names)` to `path` (one file, opens offline)."""
    path = Path(path)
    write_text(path, html_timeline(result, title, device_names))
    return path


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body{{font:13px system-ui,sans-serif;margin:12px;color:#222}}
h1{{font-size:15px;font-weight:600;margin:0 0 4px}}
.chip{{margin-right:14px;white-space:nowrap}}
.chip i{{display:inline-block;width:11px;height:11px;vertical-align:-1px;border:1px solid #999}}
.chip i:last-of-type{{margin-right:4px}}
.help{{color:#666;margin:4px 0 8px}}
#wrap{{display:flex;border:1px solid #ddd}}
#labels{{flex:none;padding-right:6px;border-right:1px solid #ddd;padding-bottom:24px}}
.lab{{display:flex;align-items:center;font-size:11px;white-space:nowrap;color:#333;
overflow:visible}}
.lab.hid{{visibility:hidden}}
svg.dense .c{{stroke:none}}
.ar-lab{{font-size:9px;color:#666}}
#scroll{{flex:1;overflow-x:auto;overflow-y:hidden;cursor:grab;position:relative}}
#content{{position:relative;width:100%}}
svg{{display:block;width:100%}}
#txt{{position:absolute;left:0;top:0;pointer-events:none;overflow:visible}}
#txt text{{font-size:11px;text-anchor:middle;dominant-baseline:central;fill:#fff}}
#txt text.later{{fill:#222}}
rect{{vector-effect:non-scaling-stroke}}
#axis{{position:relative;height:24px;border-top:1px solid #999}}
.tick{{position:absolute;top:0;font-size:10px;color:#444;border-left:1px solid #999;
padding:5px 0 0 2px;height:19px;white-space:nowrap}}
#tip{{position:fixed;display:none;background:#fff;border:1px solid #888;padding:4px 6px;
font-size:12px;pointer-events:none;box-shadow:1px 1px 4px #0003;white-space:pre}}
{styles}
</style></head><body>
<h1>{heading}</h1>
<div>{legend}</div>
<div class="help">{count}. Hover: details. Wheel or +/-: zoom in time, drag or scroll:
pan, 0: fit.</div>
<div id="wrap"><div id="labels">{labels}</div>
<div id="scroll"><div id="content">
<svg id="tl" viewBox="0 0 {span} {rows}" preserveAspectRatio="none" height="{height}"
 xmlns="http://www.w3.org/2000/svg">
{rects}
</svg><svg id="txt" xmlns="http://www.w3.org/2000/svg"></svg>
<div id="axis"></div></div></div></div>
<div id="tip"></div>
<script>
(function(){{
const SPAN={span}, ROWS={rows}, UNIT="{unit}", MIN_ROW={min_row}, kinds={kind_names};
const sc=document.getElementById("scroll"), ct=document.getElementById("content"),
  axis=document.getElementById("axis"), tip=document.getElementById("tip"),
  svg=document.getElementById("tl"), txt=document.getElementById("txt");
// Boxes that may carry a label: [x, width, row centre, microbatch, later chunk].
const boxes=[...svg.querySelectorAll('rect[id^="action-"]')].map(r=>{{
  const m=/([0-9]+)$/.exec(r.id);
  const y=+r.getAttribute("y")+(+r.getAttribute("height"))/2;
  return [+r.getAttribute("x"), +r.getAttribute("width"), y, m[1],
    !/^[A-Z]0(\\s|$)/.test(r.getAttribute("class"))];
}});
let zoom=1, rowPx=0, pending=false;
function fmt(v){{return (+v.toPrecision(6)).toString()+" "+UNIT;}}
const widths=boxes.map(b=>b[1]).sort((a,b)=>a-b), typical=widths[widths.length>>1]||SPAN;
function fitRows(){{
  // Rows fill the window's height below the drawing's top (at least MIN_ROW pixels each, so
  // that hundreds of devices still fit); labels too small to read are left out, every k-th kept.
  const top=sc.getBoundingClientRect().top+window.scrollY;
  rowPx=Math.max(MIN_ROW,(window.innerHeight-top-40)/ROWS);
  svg.setAttribute("height",rowPx*ROWS);
  const font=Math.max(7,Math.min(11,rowPx*0.8)), every=Math.ceil(font/rowPx);
  let d=0;
  for(const l of document.querySelectorAll(".lab")){{
    l.style.height=(rowPx*l.dataset.rows)+"px"; l.style.fontSize=font+"px";
    const device=l.dataset.rows==="1"?d++:-1;
    l.classList.toggle("hid",device<0?rowPx*l.dataset.rows<font:device%every!==0);
  }}
}}
function outline(){{
  // Outlines of boxes a few pixels wide would paint their rows black: only where they fit.
  svg.classList.toggle("dense",typical*ct.clientWidth/SPAN<4||rowPx<8);
}}
function labels(){{
  pending=false;
  const px=ct.clientWidth/SPAN, left=sc.scrollLeft/px, right=(sc.scrollLeft+sc.clientWidth)/px;
  txt.setAttribute("width",ct.clientWidth); txt.setAttribute("height",rowPx*ROWS);
  const size=Math.min(11,rowPx*0.6);
  let h="";
  if(size>=7)for(const [x,w,y,mb,later] of boxes){{
    if(x+w<left||x>right||w*px<size*0.62*mb.length+4)continue;
    h+='<text x="'+((x+w/2)*px).toFixed(1)+'" y="'+(y*rowPx).toFixed(1)+'"'+
      (later?' class="later"':'')+' style="font-size:'+size.toFixed(1)+'px">'+mb+'</text>';
  }}
  txt.innerHTML=h;
}}
function relabel(){{if(!pending){{pending=true;requestAnimationFrame(labels);}}}}
function ticks(){{
  const px=ct.clientWidth, want=SPAN*90/px, p=Math.pow(10,Math.floor(Math.log10(want)));
  const step=[1,2,2.5,5,10].map(m=>m*p).find(s=>s>=want);
  let h="";
  for(let t=0;t<=SPAN*1.0000001;t+=step){{
    h+='<div class="tick" style="left:'+(100*t/SPAN)+'%">'+(+t.toPrecision(6))+'</div>';
  }}
  axis.innerHTML=h+'<div class="tick" style="right:2px;border:0">'+UNIT+'</div>';
  outline(); relabel();
}}
function setZoom(z,atX){{
  z=Math.max(1,Math.min(500,z));
  const rect=sc.getBoundingClientRect(), x=(atX===undefined?rect.width/2:atX-rect.left);
  const frac=(sc.scrollLeft+x)/ct.clientWidth;
  zoom=z; ct.style.width=(100*z)+"%";
  sc.scrollLeft=frac*ct.clientWidth-x; ticks();
}}
sc.addEventListener("scroll",relabel);
sc.addEventListener("wheel",e=>{{e.preventDefault();setZoom(zoom*Math.exp(-e.deltaY/300),e.clientX);}},
  {{passive:false}});
document.addEventListener("keydown",e=>{{
  if(e.key==="+"||e.key==="=")setZoom(zoom*1.5);
  else if(e.key==="-")setZoom(zoom/1.5); else if(e.key==="0")setZoom(1);
}});
let drag=null;
sc.addEventListener("mousedown",e=>{{drag=[e.clientX,sc.scrollLeft];sc.style.cursor="grabbing";}});
window.addEventListener("mouseup",()=>{{drag=null;sc.style.cursor="grab";}});
window.addEventListener("mousemove",e=>{{
  if(drag){{sc.scrollLeft=drag[1]-(e.clientX-drag[0]);}}
  const r=e.target;
  if(r.tagName==="rect"&&r.id){{
    const m=/^action-d(\\d+)-(\\d+)([FBIW])(\\d+)$/.exec(r.id),
      g=/^reduce-d(\\d+)-s(\\d+)$/.exec(r.id);
    const x=+r.getAttribute("x"), w=+r.getAttribute("width");
    const when="\\nstart "+fmt(x)+"\\nend "+fmt(x+w)+"\\ntakes "+fmt(w);
    tip.textContent=m?m[2]+m[3]+m[4]+"  "+kinds[m[3]]+", stage "+m[2]+", microbatch "+m[4]+
      "\\ndevice "+m[1]+when:
      "all-reduce of stage "+g[2]+"'s gradients (data parallel)\\ndevice "+g[1]+when;
    tip.style.display="block";
    tip.style.left=Math.min(e.clientX+12,window.innerWidth-260)+"px";
    tip.style.top=(e.clientY+14)+"px";
  }} else tip.style.display="none";
}});
// The first labels drawn at once, not at the next frame: the page opens labelled (a headless
// browser may save the page before any frame).
window.addEventListener("resize",()=>{{fitRows();ticks();}}); fitRows(); ticks(); labels();
}})();
</script></body></html>
"""
