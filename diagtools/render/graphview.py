"""The interactive graph view: one self-contained block of inline SVG, a legend and a small script.

Works wherever HTML runs scripts (JupyterLab outputs, exported notebooks, the
postmortem page) with no network and no widget state: zoom (buttons or
Ctrl+wheel), pan (drag), open fitted to the view (the whole graph, width and height, with a
zoom-in cue when its text is small), click a module for its file, times and stack, export the graph
as SVG or PNG (drawn on a canvas in the page).  Where scripts do not run
(an ipywidgets HTML view, a sanitized viewer) the same block still shows
the graph at its natural size in a scrolling box, with the legend.
"""

from __future__ import annotations

import itertools
import json
import re
from html import escape, unescape
from typing import Any

from diagtools.model.scan import ScanResult
from diagtools.render.paths import display_path, import_roots

__all__ = ["BASE_FONT_PX", "MIN_FONT_PX", "graph_view_html", "node_details", "prepare_svg"]

BASE_FONT_PX = 12  # the graph's node font size: at scale 1 one SVG unit is one CSS pixel
MIN_FONT_PX = 10  # text below this is small: the view then shows its zoom-in cue
FLOOR_SCALE = 0.4  # "fit" shows the whole graph down to this scale; a wider one opens centred on the culprit
_IDS = itertools.count(1)

_LEGEND = (
    ("#d62728", "solid", "initializes CUDA (the culprit)"),
    ("#ffbb78", "solid", "on the import chain to it"),
    ("#f2f2f2", "solid", "other module (+N: modules collapsed below it)"),
    ("#eeeeee", "dashed", "no longer imported after the fix"),
    ("#f2f2f2", "double", "starts threads at import"),
)

_CSS = (
    "<style>.dtg{margin:6px 0;max-width:100%}.dtg-bar{display:flex;flex-wrap:wrap;gap:4px;align-items:center;"
    "margin:4px 0}.dtg-bar button{font:12px system-ui,sans-serif;padding:2px 8px;cursor:pointer}"
    ".dtg-hint{font-size:12px;color:#555}.dtg-cue{font-size:12px;color:#a15c00;font-weight:600}"
    ".dtg-legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;"
    "margin:4px 0}.dtg-sw{display:inline-block;width:14px;height:10px;border:1px solid #555;margin-right:4px;"
    "vertical-align:middle}.dtg-view{overflow:auto;max-height:70vh;border:1px solid #ddd;background:#fff}"
    ".dtg-live .dtg-view{overflow:hidden;position:relative;cursor:grab;touch-action:none}"
    ".dtg-live .dtg-view svg{position:absolute;left:0;top:0;max-width:none!important}"
    ".dtg-info{overflow-wrap:anywhere;word-break:break-word}.dtg-view svg g.node{cursor:pointer}"
    ".dtg-view svg g.dtg-sel polygon,.dtg-view svg g.dtg-sel ellipse"
    "{stroke:#1f77b4;stroke-width:4}.dtg-info{font-size:12px;margin:4px 0}.dtg-info table{border-collapse:"
    "collapse}.dtg-info th,.dtg-info td{text-align:left!important;padding:1px 8px 1px 0;vertical-align:top}"
    ".dtg-info th{font-weight:600;white-space:nowrap}.dtg-info pre{margin:2px 0;"
    "white-space:pre-wrap}</style>"
)

# Plain ES5 so that any browser an exported report lands in runs it; user strings only ever reach the page
# through textContent.
_SCRIPT = r"""(function(){
function dl(blob,name){var a=document.createElement('a');a.href=URL.createObjectURL(blob);a.download=name;
document.body.appendChild(a);a.click();setTimeout(function(){URL.revokeObjectURL(a.href);a.remove();},1500);}
function setup(box){
box.setAttribute('data-dtg-ready','1');
var view=box.querySelector('.dtg-view'),svg=view&&view.querySelector('svg'),info=box.querySelector('.dtg-info');
if(!svg)return;
var data={};try{data=JSON.parse(box.querySelector('.dtg-data').textContent);}catch(e){}
var W=parseFloat(svg.getAttribute('width')),H=parseFloat(svg.getAttribute('height'));
var minS=parseFloat(box.getAttribute('data-min-scale'))||1,name=box.getAttribute('data-name')||'graph';
var floor=parseFloat(box.getAttribute('data-floor-scale'))||minS,cue=box.querySelector('.dtg-cue');
var s=1,x=0,y=0,touched=false,drag=null,moved=false;
box.classList.add('dtg-live');box.querySelector('.dtg-bar').hidden=false;
svg.style.transformOrigin='0 0';
function apply(){svg.style.transform='translate('+x+'px,'+y+'px) scale('+s+')';
box.setAttribute('data-scale',s.toFixed(3));if(cue)cue.hidden=s>=minS-1e-3;}
function fit(){var w=view.clientWidth;if(!w)return false;var room=Math.max(260,window.innerHeight*0.7);
s=Math.max(floor,Math.min(1.5,(w-8)/W,(room-12)/H));x=Math.max(0,(w-W*s)/2);y=4;
if(W*s>w){centre(svg.querySelector('g.node.culprit'),w);}view.style.height=Math.round(Math.min(H*s+12,room))+'px';
apply();return true;}
function centre(node,w){if(!node||!node.getBBox)return;var b=node.getBBox(),g=svg.querySelector('g.graph'),
tr=g&&/translate\(([-\d.]+)/.exec(g.getAttribute('transform')||''),tx=tr?parseFloat(tr[1]):0;
x=Math.min(0,Math.max(w-W*s,w/2-(b.x+tx+b.width/2)*s));}
function zoom(f,cx,cy){var n=Math.max(minS/4,Math.min(8,s*f));if(cx===undefined){cx=view.clientWidth/2;
cy=view.clientHeight/2;}x=cx-(cx-x)*n/s;y=cy-(cy-y)*n/s;s=n;touched=true;apply();}
function row(t,k,v){var tr=document.createElement('tr'),th=document.createElement('th'),td=document.createElement('td');
th.textContent=k;td.textContent=v;tr.appendChild(th);tr.appendChild(td);t.appendChild(tr);}
function show(g){var old=view.querySelector('g.dtg-sel');if(old)old.classList.remove('dtg-sel');
g.classList.add('dtg-sel');var t=g.querySelector('title'),key=t?t.textContent:'',d=data[key];
info.textContent='';var h=document.createElement('b');h.textContent=key;info.appendChild(h);
if(!d){return;}var tb=document.createElement('table');Object.keys(d).forEach(function(k){
if(k!=='stack')row(tb,k,d[k]);});info.appendChild(tb);
if(d.stack&&d.stack.length){var p=document.createElement('div');
p.textContent='Python stack when CUDA was initialized (outermost first):';
var pre=document.createElement('pre');pre.textContent=d.stack.join('\n');info.appendChild(p);info.appendChild(pre);}}
function serialized(){var c=svg.cloneNode(true);c.removeAttribute('style');
c.setAttribute('xmlns','http://www.w3.org/2000/svg');c.setAttribute('xmlns:xlink','http://www.w3.org/1999/xlink');
return new XMLSerializer().serializeToString(c);}
function png(){var img=new Image();img.onload=function(){var c=document.createElement('canvas');c.width=W*2;
c.height=H*2;var g=c.getContext('2d');g.fillStyle='#fff';g.fillRect(0,0,c.width,c.height);g.scale(2,2);
g.drawImage(img,0,0,W,H);c.toBlob(function(b){dl(b,name+'.png');});};
img.src='data:image/svg+xml;charset=utf-8,'+encodeURIComponent(serialized());}
var acts={fit:function(){touched=true;fit();},'in':function(){zoom(1.25);},out:function(){zoom(0.8);},
one:function(){s=1;x=0;y=4;touched=true;apply();},
svg:function(){dl(new Blob([serialized()],{type:'image/svg+xml'}),name+'.svg');},png:png};
box.querySelectorAll('.dtg-bar button').forEach(function(b){b.addEventListener('click',function(){
var a=acts[b.getAttribute('data-act')];if(a)a();});});
view.addEventListener('wheel',function(e){if(!(e.ctrlKey||e.metaKey))return;e.preventDefault();
var r=view.getBoundingClientRect();zoom(e.deltaY<0?1.15:1/1.15,e.clientX-r.left,e.clientY-r.top);},{passive:false});
view.addEventListener('pointerdown',function(e){drag=[e.clientX,e.clientY,x,y];moved=false;});
view.addEventListener('pointermove',function(e){if(!drag)return;var dx=e.clientX-drag[0],dy=e.clientY-drag[1];
if(Math.abs(dx)+Math.abs(dy)>3){moved=true;touched=true;view.style.cursor='grabbing';}
if(moved){x=drag[2]+dx;y=drag[3]+dy;apply();}});
function up(){drag=null;view.style.cursor='';}
view.addEventListener('scroll',function(){if(view.scrollLeft||view.scrollTop){x-=view.scrollLeft;y-=view.scrollTop;
view.scrollLeft=0;view.scrollTop=0;apply();}});
view.addEventListener('pointerup',up);view.addEventListener('pointerleave',up);
view.addEventListener('click',function(e){if(moved)return;var g=e.target.closest&&e.target.closest('g.node');
if(g)show(g);});
if(!fit()&&window.ResizeObserver){var ro=new ResizeObserver(function(){if(!touched&&fit())ro.disconnect();});
ro.observe(view);}
var pick=box.getAttribute('data-selected');if(pick){view.querySelectorAll('g.node title').forEach(function(t){
if(t.textContent===pick)show(t.parentNode);});}}
document.querySelectorAll('div.dtg:not([data-dtg-ready])').forEach(setup);
})();"""

_OPEN_TAG = re.compile(r"<svg\b[^>]*>")
_VIEWBOX = re.compile(r'viewBox="[\d.\-]+ [\d.\-]+ ([\d.]+) ([\d.]+)"')
_TITLE = re.compile(r"<title>(.*?)</title>", re.DOTALL)


def prepare_svg(svg: str, prefix: str) -> str:
    """Graphviz SVG with one SVG unit per CSS pixel and ids made unique within the page."""
    svg = svg[svg.find("<svg") :]
    opening = _OPEN_TAG.search(svg)
    box = _VIEWBOX.search(opening.group(0)) if opening else None
    if opening is not None and box is not None:
        tag = re.sub(r'\bwidth="[\d.]+pt"', f'width="{box.group(1)}"', opening.group(0), count=1)
        tag = re.sub(r'\bheight="[\d.]+pt"', f'height="{box.group(2)}"', tag, count=1)
        svg = svg[: opening.start()] + tag + svg[opening.end() :]
    return re.sub(r'\bid="', f'id="{prefix}-', svg)


def node_details(result: ScanResult) -> dict[str, dict[str, Any]]:
    """What a click on a module shows: file, importer, times, threads, and the culprit's line and stack."""
    roots = import_roots(result)
    details: dict[str, dict[str, Any]] = {}
    for node in result.modules:
        entry: dict[str, Any] = {
            "file": display_path(node.file, roots) or "(builtin, frozen or namespace)",
            "imported by": node.parent or "(the scan request or start-up)",
            "self": f"{node.self_s * 1000:.2f} ms",
            "cumulative": f"{node.cumulative_s * 1000:.2f} ms",
            "threads started": str(node.threads_started),
            "initializes CUDA": "yes" if node.initializes_cuda else "no",
        }
        for culprit in result.culprits:
            at = culprit.initialized_at
            if culprit.module == node.name and at is not None:
                entry["CUDA initialized at"] = f"{display_path(at.file, roots)}:{at.line}: {at.source.strip()}"
                inside = culprit.initialized_in
                if inside is not None:
                    entry["initialized in"] = (
                        f"{display_path(inside.file, roots)}:{inside.line}: {inside.source.strip()}"
                    )
                entry["stack"] = [f"{display_path(f.file, roots)}:{f.line} in {f.function}" for f in culprit.stack]
        details[node.name] = entry
    headline = result.headline
    if headline.edge is not None and headline.line is not None and headline.edge.importer in details:
        line = headline.line
        where = f"{display_path(line.file, roots)}:{line.line}: {line.source.strip()}"
        details[headline.edge.importer]["line to change"] = f"{where} (the nearest verified cut)"
    return details


def _legend() -> str:
    items = []
    for colour, border, text in _LEGEND:
        style = f"background:{colour};border-style:{border}" + (";border-width:3px" if border == "double" else "")
        items.append(f'<span><span class="dtg-sw" style="{style}"></span>{escape(text)}</span>')
    items.append('<span><b style="color:#d62728">&rarr;</b> import chain to the culprit</span>')
    return f'<div class="dtg-legend">{"".join(items)}</div>'


def graph_view_html(
    svg: str,
    details: dict[str, dict[str, Any]] | None = None,
    *,
    name: str = "imports",
    selected: str | None = None,
) -> str:
    """The self-contained interactive block for one graphviz SVG; ``details`` maps node names to their facts."""
    prefix = f"dtg{next(_IDS)}"
    shown = {unescape(title) for title in _TITLE.findall(svg)}
    data = {key: (details or {})[key] for key in sorted(shown & set(details or {}))}
    payload = json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e")
    buttons = "".join(
        f'<button type="button" data-act="{act}" title="{escape(tip)}">{escape(label)}</button>'
        for act, label, tip in (
            ("fit", "Fit", "fit the whole graph in the view"),
            ("in", "+", "zoom in (or Ctrl+wheel)"),
            ("out", "\u2212", "zoom out"),
            ("one", "1:1", "natural size"),
            ("svg", "Export SVG", "download the graph as SVG"),
            ("png", "Export PNG", "download the graph as PNG"),
        )
    )
    picked = f' data-selected="{escape(selected)}"' if selected else ""
    return (
        f'{_CSS}<div class="dtg" id="{prefix}" data-name="{escape(name)}" '
        f'data-min-scale="{MIN_FONT_PX / BASE_FONT_PX:.4f}" data-floor-scale="{FLOOR_SCALE}"{picked}>'
        f'<div class="dtg-bar" hidden>{buttons}<span class="dtg-hint">drag to pan &middot; click a module for its '
        'file, times and stack</span><span class="dtg-cue" hidden>The whole graph, fitted to the view: '
        "zoom in (+ or Ctrl+wheel) to read it, then drag to pan</span></div>"
        f"{_legend()}"
        f'<div class="dtg-view">{prepare_svg(svg, prefix)}</div>'
        '<div class="dtg-info"></div>'
        f'<script type="application/json" class="dtg-data">{payload}</script>'
        f"<script>{_SCRIPT}</script></div>"
    )
