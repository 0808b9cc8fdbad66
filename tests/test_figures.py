"""Every committed figure reads whole and honest: no label leaves its view box, no two series share
a look (and, while the palette lasts, a colour), every series is named in its legend, and a
figure's labels are its table's cells, word for word."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from omniprobe.analysis.capacity_bands import newest_searches
from omniprobe.analysis.capacity_curve import CapacityCurve, CapRun, capacity_curve, served_at
from omniprobe.evidence.validate import load_valid_project
from omniprobe.report.capacity_svg import need_rows, render_curve_svg
from omniprobe.report.capacity_view import capacity_search_view
from omniprobe.report.emulation_view import curve_figure
from omniprobe.report.pool_svg import CardLine, PoolLine, band_polygons, render_pool_svg
from omniprobe.report.timeline_svg import CHAR_EM, SERIES_COLOURS, render_svg, series_style
from tests.test_timeline import POINTS

from .rendered import render_outputs

SVG = "{http://www.w3.org/2000/svg}"
LINES = (f"{SVG}polyline", f"{SVG}line")


# --- the checks -----------------------------------------------------------------------------


def _inherited(element, parents: dict, name: str) -> str | None:
    while element is not None:
        if element.get(name) is not None:
            return element.get(name)
        element = parents.get(element)
    return None


def text_extents(root) -> list[tuple[str, float, float, float, float]]:
    """(text, x0, y0, x1, y1) of every text element: its width len × font size × CHAR_EM from its
    anchor, its height the font size above its baseline."""
    parents = {child: parent for parent in root.iter() for child in parent}
    out = []
    for t in root.iter(f"{SVG}text"):
        size = float(_inherited(t, parents, "font-size"))
        x, y, width = float(t.get("x")), float(t.get("y")), len(t.text or "") * size * CHAR_EM
        x0 = {"start": x, "middle": x - width / 2, "end": x - width}[
            _inherited(t, parents, "text-anchor") or "start"]
        out.append((t.text or "", x0, y - size, x0 + width, y))
    return out


def clipped(svg: str) -> list[str]:
    """The labels whose estimated extent leaves the view box."""
    root = ET.fromstring(svg)
    left, top, width, height = map(float, root.get("viewBox").split())
    return [text for text, x0, y0, x1, y1 in text_extents(root)
            if x0 < left or y0 < top or x1 > left + width or y1 > top + height]


def series_looks(root) -> dict[str, tuple[str, str | None]]:
    """Each series' (colour, dash pattern), as its group draws it; a dot series' colour is its
    fill."""
    return {g.get("data-series"): (g.get("stroke") or g.get("fill"), g.get("stroke-dasharray"))
            for g in root.iter(f"{SVG}g") if g.get("data-series") is not None}


def colour_clashes(svg: str) -> list[str]:
    """Pairs of series that look alike: the same colour and dash, or, where the figure has no more
    series than the palette has colours, the same colour."""
    looks = list(series_looks(ET.fromstring(svg)).items())
    one_each = len(looks) <= len(SERIES_COLOURS)
    return [f"{a} / {b}" for i, (a, (colour_a, dash_a)) in enumerate(looks)
            for b, (colour_b, dash_b) in looks[i + 1:]
            if colour_a == colour_b and (one_each or dash_a == dash_b)]


def unnamed(svg: str) -> list[str]:
    """The series no legend names: none of the figure's texts is its name (or starts with it), or
    no legend sample draws it as the series is drawn."""
    root = ET.fromstring(svg)
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    samples = {e.get("data-legend"): (e.get("stroke") or e.get("fill"), e.get("stroke-dasharray"))
               for e in root.iter() if e.get("data-legend") is not None}
    return [name for name, look in series_looks(root).items()
            if not any(t == name or t.startswith((f"{name}:", f"{name},", f"{name} "))
                       for t in texts) or samples.get(name) != look]


def unplotted(svg: str) -> list[str]:
    """Lines and polylines in no series, neither a grid line nor a legend's sample: a line the
    checks could not see."""
    root = ET.fromstring(svg)
    inside = {e for g in root.iter(f"{SVG}g") if g.get("data-series") is not None
              for e in g.iter()}
    return [ET.tostring(e, encoding="unicode")[:80] for e in root.iter()
            if e.tag in LINES and e not in inside and e.get("class") != "grid"
            and e.get("data-legend") is None]


def problems(svg: str) -> dict[str, list[str]]:
    found = {"clipped": clipped(svg), "colour clashes": colour_clashes(svg),
             "unnamed": unnamed(svg), "unplotted": unplotted(svg)}
    return {k: v for k, v in found.items() if v}


def row_cells(svg: str, row_label: str) -> list[str]:
    """The centred labels on the baseline of a figure's row, left to right: its cells."""
    boxes = text_extents(ET.fromstring(svg))
    baseline = next(y1 for text, *_, y1 in boxes if text == row_label)
    cells = {(x0 + x1) / 2: text for text, x0, _, x1, y1 in boxes
             if y1 == baseline and text != row_label and x0 > 0}
    return [cells[x] for x in sorted(cells)]


# --- every figure the project renders ---------------------------------------------------------


def test_every_figure_of_the_report_is_whole_and_tells_its_lines_apart(repo):
    figures = {path: text for path, text in render_outputs(repo).items() if path.suffix == ".svg"}
    assert figures
    assert {str(path): found for path, text in figures.items() if (found := problems(text))} == {}


def test_each_curve_figure_labels_its_rows_with_its_tables_cells(repo):
    loaded = load_valid_project(repo)
    figures = [curve_figure(curve, loaded.hosts.host(key)) for key in loaded.hosts.hosts
               if (curve := capacity_curve(key, loaded.hosts, loaded.fixtures, loaded.evidence))]
    assert figures
    for figure in figures:
        for flag_set, cells in figure.rows:
            label = next(t for t in (flag_set, f"{flag_set}: no count served")
                         if t in [e[0] for e in text_extents(ET.fromstring(figure.svg))])
            assert row_cells(figure.svg, label) == cells, (figure.path, flag_set)


def test_the_pool_figure_labels_its_rows_with_the_bands_tables_cells(repo):
    loaded = load_valid_project(repo)
    folder = "models/qwen-image-2.1/full"
    searches = newest_searches(loaded.evidence, folder)
    view = capacity_search_view(loaded, [], {}, searches, "Qwen-Image-2.1", folder)
    assert view is not None and view.rows
    for row in view.rows:
        assert row_cells(view.figure_svg, row.profile) == row.cells, row.profile
        # the cost table names the machine whose seconds its row gives
        assert row.gpu == loaded.hosts.host(searches[row.profile].host).gpu, row.profile
    # A band is shaded only where its B was tried: `group-leaf-nokv`'s counts 1-4 take the
    # previous count's B, so its one band is count 0's.
    nokv = re.search(r'<g data-series="group-leaf-nokv".*?</g>', view.figure_svg).group(0)
    leaf = re.search(r'<g data-series="group-leaf".*?</g>', view.figure_svg).group(0)
    assert nokv.count("<polygon") == 1 and leaf.count("<polygon") == 1  # leaf: one run, 0-4


# --- what the sweep measured, in words ----------------------------------------------------------


def _curve(runs: tuple[CapRun, ...]) -> CapacityCurve:
    flag_sets = tuple(dict.fromkeys(r.flag_set for r in runs))
    counts = tuple(sorted({n for r in runs for n in r.asked_refs}))
    return CapacityCurve("h", tuple(sorted({r.cap_mib for r in runs})), flag_sets, counts, runs,
                         ())


def test_a_need_says_what_the_caps_measured_and_a_count_never_asked_reads_not_run():
    curve = _curve((
        CapRun(16384, "cpuoff", "a", False, (), ()),  # the server did not start: nothing fit
        CapRun(20480, "cpuoff", "b", True, (1, 2), (1,)),
        CapRun(24576, "cpuoff", "c", True, (1,), (1,)),  # never asked for 2 at 24 GiB
        CapRun(20480, "fp8", "b", True, (1, 2, 3), (1, 2, 3)),
        CapRun(20480, "default", "b", True, (1,), ()),
    ))
    assert served_at(curve, "cpuoff", 2) == {16384: False, 20480: False}
    rows = dict(need_rows(curve))
    # 1: failed at 16, served at 20; 2: failed up to 20, the largest cap that asked for it;
    # 3: the server did not start at 16, and no cap that started asked for it
    assert rows["cpuoff"] == ["16–20", "> 20", "> 16"]
    assert rows["fp8"] == ["≤ 20", "≤ 20", "≤ 20"]
    assert rows["default"] == ["> 20", "not run", "not run"]


def test_a_curve_figures_rows_are_its_tables_and_say_which_flag_set_has_no_line():
    curve = _curve((CapRun(20480, "cpuoff", "a", True, (1, 2), (1,)),
                    CapRun(24576, "cpuoff", "b", True, (1, 2), (1, 2)),
                    CapRun(24576, "fp8", "b", True, (1, 2), ())))
    curve = CapacityCurve(curve.host, curve.caps_mib, curve.flag_sets, curve.reference_counts,
                          curve.runs, _steps(curve))
    figure = curve_figure(curve, SimpleNamespace(name="h"))
    assert figure.rows == [("cpuoff", ["≤ 20", "20–24"]), ("fp8", ["> 24", "> 24"])]
    assert row_cells(figure.svg, "cpuoff") == ["≤ 20", "20–24"]
    assert row_cells(figure.svg, "fp8: no count served") == ["> 24", "> 24"]
    assert problems(figure.svg) == {}


def _steps(curve: CapacityCurve):
    from omniprobe.analysis.capacity_curve import CurveStep

    return tuple(CurveStep(f, n, min((c for c, ok in served_at(curve, f, n).items() if ok),
                                     default=None), max(curve.caps_mib))
                 for f in curve.flag_sets for n in curve.reference_counts)


# --- the checks catch what they are for ---------------------------------------------------------


def _svg(body: str, width: int = 200, height: int = 100) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'font-size="11">{body}</svg>')


def _series(name: str, stroke: str, dash: str | None = None) -> str:
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<g data-series="{name}" stroke="{stroke}"{dashed}><polyline points="0,0 9,9"/></g>'
            f'<line data-legend="{name}" stroke="{stroke}"{dashed}/><text x="0" y="50">{name}</text>')


def test_the_checks_catch_a_cut_label_two_lines_of_one_colour_and_an_unnamed_line():
    long_label = _svg('<text x="150" y="20">a label far too long for its figure</text>')
    assert clipped(long_label) == ["a label far too long for its figure"]
    assert clipped(_svg('<text x="100" y="20" text-anchor="end">ends at its x</text>')) == []
    assert clipped(_svg('<text x="10" y="5">over the top</text>')) == ["over the top"]
    same = _svg(_series("a", "#0072B2") + _series("b", "#0072B2", "4 3"))
    assert colour_clashes(same) == ["a / b"]  # a dash is no excuse while colours are left
    assert colour_clashes(_svg(_series("a", "#0072B2") + _series("b", "#D55E00"))) == []
    nameless = _svg('<g data-series="x" stroke="#000"><polyline points="0,0 1,1"/></g>')
    assert unnamed(nameless) == ["x"]
    assert unplotted(_svg('<polyline points="0,0 1,1" stroke="#000"/>')) != []


def test_past_the_palette_a_colour_comes_back_only_with_another_dash():
    looks = [series_style(i) for i in range(3 * len(SERIES_COLOURS) + 1)]
    assert len(set(looks)) == len(looks)
    assert len({c for c, _ in looks[:len(SERIES_COLOURS)]}) == len(SERIES_COLOURS)
    many = _svg("".join(_series(f"s{i}", *series_style(i)) for i in range(10)))
    assert colour_clashes(many) == []
    clash = _svg("".join(_series(f"s{i}", *series_style(i % 8)) for i in range(10)))
    assert colour_clashes(clash) == ["s0 / s8", "s1 / s9"]


# --- long names and many series, in every figure --------------------------------------------------

LONG = "a-flag-set-with-a-name-much-longer-than-any-the-project-has-today"


@pytest.mark.parametrize("series", [1, 10])
def test_every_figure_widens_or_wraps_to_long_names_and_tells_many_series_apart(series):
    names = [f"{LONG}-{i}" for i in range(series)]
    runs = tuple(CapRun(cap, name, "a", True, (1, 2, 3), (1, 2, 3) if cap > 20480 else (1,))
                 for cap in (20480, 24576) for name in names)
    curve = _curve(runs)
    curve = CapacityCurve(curve.host, curve.caps_mib, curve.flag_sets, curve.reference_counts,
                          runs, _steps(curve))
    title = "A title that goes on and on about what the figure shows, " * 3
    pool = render_pool_svg(
        [PoolLine(name, ((0, 7936, 8448), (1, None, 9000)), ("7,936–8,448", f"no band ({LONG})"))
         for name in names],
        [CardLine(LONG, 15872, assumed=True), CardLine("RTX 3060", 11776),
         CardLine("RTX 5070", 11715)], [0, 1], title=title)
    timeline = render_svg(POINTS, title=title + LONG, capacity_mib=24576,
                          markers=[(1.0, f"{LONG} seed 2301: ok"), (3.9, "x")],
                          note=f"NVML said {LONG} " * 4)
    for svg in (render_curve_svg(curve, title=title), pool, timeline,
                render_svg([], title=title, note=LONG * 2)):
        assert problems(svg) == {}


@pytest.mark.parametrize("points, shapes", [
    # neighbouring counts with both sides: one outline along A and back along B
    ([(0, 90, 80), (10, 70, 60)], [[(0, 80), (10, 60), (10, 70), (0, 90)]]),
    # a count without B breaks the band; a count alone is a bar of its own width
    ([(0, 90, 80), (10, None, 60), (20, 50, 40)],
     [[(-7, 80), (7, 80), (7, 90), (-7, 90)], [(13, 40), (27, 40), (27, 50), (13, 50)]]),
    ([(0, None, 80)], []),
])
def test_a_band_is_drawn_as_a_band(points, shapes):
    assert band_polygons(points) == shapes


def test_the_pool_figure_has_one_unit_and_marks_the_cards_resting_on_an_assumption():
    svg = render_pool_svg([PoolLine("p", ((0, 7936, 8448), (1, 8448, 9000)), ("a", "b"))],
                          [CardLine("RTX 3090", 24064, assumed=True), CardLine("Measured", 20000)],
                          [0, 1], title="t")
    labels = re.findall(r">([^<]*)</text>", svg)
    assert "RTX 3090: 24,064 MiB *" in labels and "Measured: 20,000 MiB" in labels
    axis = [t for t in labels if re.fullmatch(r"[\d,]+ \w+", t)]
    assert axis and all(t.endswith(" MiB") for t in axis)
    assert "<polygon" in svg and "GiB" not in svg


def test_a_profile_searched_at_one_count_is_a_larger_ringed_point():
    svg = render_pool_svg([PoolLine("curve", ((0, 7936, 8192), (4, 17920, 18176)), ("a", "b")),
                           PoolLine("lone", ((4, 7936, 8192),), ("—", "c"))],
                          [CardLine("card", 16000)], [0, 4], title="t")
    groups = {g.get("data-series") or g.get("id"): g for g in ET.fromstring(svg).iter()
              if g.tag.endswith("g")}
    radii = {name: {c.get("r") for c in g.iter() if c.tag.endswith("circle")}
             for name, g in groups.items() if name in ("curve", "lone")}
    assert radii == {"curve": {"3"}, "lone": {"5"}}


@pytest.mark.parametrize("b_inferred, said", [(True, True), (False, False)])
def test_the_pool_figure_explains_a_parenthesised_b_only_where_a_cell_has_one(b_inferred, said):
    svg = render_pool_svg([PoolLine("p", ((0, 7936, 8448), (1, None, 9000)), ("a", "(8,448)–9,000"))],
                          [CardLine("card", 16000)], [0, 1], title="t", b_inferred=b_inferred)
    text = " ".join(re.findall(r">([^<]*)</text>", svg))
    assert ("a B in parentheses" in text) is said
    assert "B–A (MiB): the count failed" in text
