#include "hyla/io/svg.h"

#include <fmt/format.h>

#include <algorithm>

#include "hyla/core/text.h"

namespace hyla {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

// Sans-serif text's width, near enough to keep labels clear of each other and of the edges.
double text_width(const std::string& text, double font_size) { return 0.6 * font_size * double(text.size()); }

std::string svg_open(double width, double height, double font_size) {
  return fmt::format(R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="{}">)svg",
                     width, height, font_size);
}

std::string svg_title(double x, const std::string& title) {
  return fmt::format(R"svg(<text x="{}" y="18" font-size="13" font-weight="bold">{}</text>)svg", x, html_escape(title));
}

// The smallest 1, 2 or 5 × 10^k that cuts `span` into at most `intervals` pieces.
double round_step(double span, int intervals) {
  const double raw = span / intervals;
  const double decade = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * decade >= raw * (1 - 1e-9)) return m * decade;
  return 10 * decade;
}

// Multiples k · step for k in [first, last]; computed from k, not summed, so 3 · 5e-4 prints as 0.0015.
std::vector<double> multiples(double step, double first, double last) {
  std::vector<double> out;
  for (double k = first; k <= last; ++k) out.push_back(k == 0 ? 0.0 : k * step);
  return out;
}

}  // namespace

Axis value_axis(double lo, double hi) {
  if (!(hi > lo)) hi = lo + 1;
  Axis a;
  a.step = round_step(hi - lo, 5);
  // The tolerance keeps a value that is a multiple up to rounding (0.3 / 0.1) from adding a tick.
  const double first = std::floor(lo / a.step + 1e-6), last = std::ceil(hi / a.step - 1e-6);
  a.ticks = multiples(a.step, first, last);
  a.lo = a.ticks.front(), a.hi = a.ticks.back();
  return a;
}

Axis step_axis(double lo, double hi) {
  if (!(hi > lo)) hi = lo + 1;
  Axis a{lo, hi, round_step(hi - lo, 6), {}};
  a.ticks = multiples(a.step, std::ceil(lo / a.step - 1e-6), std::floor(hi / a.step + 1e-6));
  return a;
}

std::string tick_label(double value, double step) {
  const int decimals = std::max(0, -int(std::floor(std::log10(step) + 1e-9)));
  if (std::fabs(value) < step * 1e-6) return "0";  // not "0.0000", nor "-0.000" from rounding
  return fmt::format("{:.{}f}", value, decimals);
}

std::string line_chart_svg(const LineChart& chart) {
  constexpr double W = 720, H = 270, right = 30, top = 34, bottom = 42, font = 11;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const ChartSeries& s : chart.series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  const bool has_reference = std::isfinite(chart.reference);
  if (has_reference) y0 = std::min(y0, chart.reference), y1 = std::max(y1, chart.reference);
  if (x0 > x1) return fmt::format("<p>{}: no data</p>", html_escape(chart.title));
  if (x1 == x0) x1 = x0 + 1;
  const Axis xa = step_axis(x0, x1), ya = value_axis(y0, y1);
  std::vector<std::string> y_labels;
  double widest = 0;
  for (double t : ya.ticks) {
    y_labels.push_back(tick_label(t, ya.step));
    widest = std::max(widest, text_width(y_labels.back(), font));
  }
  const double left = std::max(40.0, widest + 12);
  auto X = [&](double x) { return left + (x - xa.lo) / (xa.hi - xa.lo) * (W - left - right); };
  auto Y = [&](double y) { return top + (1 - (y - ya.lo) / (ya.hi - ya.lo)) * (H - top - bottom); };
  std::string svg = svg_open(W, H, font) + svg_title(left, chart.title);
  for (size_t i = 0; i < ya.ticks.size(); ++i)
    svg += fmt::format(R"svg(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#ddd"/><text x="{}" y="{:.1f}" text-anchor="end">{}</text>)svg",
                       left, W - right, Y(ya.ticks[i]), Y(ya.ticks[i]), left - 5, Y(ya.ticks[i]) + 4, y_labels[i]);
  for (double t : xa.ticks)
    svg += fmt::format(R"svg(<line x1="{0:.1f}" x2="{0:.1f}" y1="{1}" y2="{2}" stroke="#999"/><text x="{0:.1f}" y="{3}" text-anchor="middle">{4}</text>)svg",
                       X(t), H - bottom, H - bottom + 4, H - bottom + 16, tick_label(t, xa.step));
  svg += fmt::format(R"svg(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#999"/>)svg", left, top,
                     W - left - right, H - top - bottom);
  svg += fmt::format(R"svg(<text x="{}" y="{}" text-anchor="middle">step</text>)svg", (left + W - right) / 2, H - 8);
  for (const ChartMark& mark : chart.marks) {
    if (mark.step > x0)  // a mark at the first step is the left edge: label only
      svg += fmt::format(R"svg(<line x1="{0:.1f}" x2="{0:.1f}" y1="{1}" y2="{2}" stroke="#999" stroke-dasharray="4 3"><title>stage boundary at step {3:.0f}</title></line>)svg",
                         X(mark.step), top, H - bottom, mark.step);
    // Right of its line, or left of it where it would run off the chart; a white outline keeps
    // it readable where a curve passes under it.
    const double at = X(std::max(mark.step, x0));
    const bool fits_right = at + 3 + text_width(mark.label, 10) <= W;
    svg += fmt::format(R"svg(<text x="{:.1f}" y="{}" font-size="10" fill="#555" text-anchor="{}" stroke="white" stroke-width="3" paint-order="stroke">{}</text>)svg",
                       fits_right ? at + 3 : at - 3, top + 11, fits_right ? "start" : "end", html_escape(mark.label));
  }
  if (has_reference)
    svg += fmt::format(R"svg(<line x1="{0}" x2="{1}" y1="{2:.1f}" y2="{2:.1f}" stroke="#c33" stroke-dasharray="6 3"/><text x="{3}" y="{4:.1f}" fill="#c33" text-anchor="end">{5}</text>)svg",
                       left, W - right, Y(chart.reference), W - right - 2, Y(chart.reference) - 4,
                       html_escape(chart.reference_label));
  std::vector<std::string> colours;
  for (size_t i = 0; i < chart.series.size(); ++i)
    colours.push_back(chart.series[i].colour.empty() ? kPalette[i % std::size(kPalette)] : chart.series[i].colour);
  // The legend sits in the title row, right-aligned, clear of the plot and its marks' labels.
  double legend_x = W - right;
  for (size_t i = chart.series.size(); i-- > 0;) {
    legend_x -= 14 + text_width(chart.series[i].name, font);
    svg += fmt::format(R"svg(<rect x="{:.1f}" y="9" width="10" height="10" fill="{}"/><text x="{:.1f}" y="18">{}</text>)svg",
                       legend_x, colours[i], legend_x + 14, html_escape(chart.series[i].name));
    legend_x -= 16;
  }
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const ChartSeries& s = chart.series[i];
    if (s.line) {
      std::string path;
      for (auto [x, y] : s.points)
        if (std::isfinite(y)) path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", X(x), Y(y));
      svg += fmt::format(R"svg(<path d="{}" fill="none" stroke="{}" stroke-width="1.5"/>)svg", path, colours[i]);
    }
    if (s.dots)
      for (auto [x, y] : s.points)
        if (std::isfinite(y))
          svg += fmt::format(R"svg(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"><title>step {:.0f}: {:.4f}</title></circle>)svg",
                             X(x), Y(y), colours[i], x, y);
  }
  return svg + "</svg>";
}

std::string scale_colour(std::span<const Rgb> stops, double share) {
  const double at = std::clamp(share, 0.0, 1.0) * double(stops.size() - 1);
  const size_t from = std::min(size_t(at), stops.size() - 2);
  const double t = at - double(from);
  const Rgb &a = stops[from], &b = stops[from + 1];
  const auto mix = [&](double Rgb::*channel) { return int(std::lround(a.*channel + (b.*channel - a.*channel) * t)); };
  return fmt::format("rgb({},{},{})", mix(&Rgb::r), mix(&Rgb::g), mix(&Rgb::b));
}

std::string heat_map_svg(const HeatMap& map) {
  constexpr double font = 11;
  const double w = map.cell_width, h = map.cell_height, gap = map.outlined ? 0 : 2;
  double left = 40, label_height = 0, label_reach = 0;
  for (const std::string& row : map.rows) left = std::max(left, std::ceil(text_width(row, font)) + 12);
  // Column labels slant up to the right at 60°: up by sin 60° and right by cos 60° of their width.
  for (size_t j = 0; j < map.columns.size(); ++j) {
    label_height = std::max(label_height, std::ceil(0.87 * text_width(map.columns[j], font)) + 8);
    label_reach = std::max(label_reach, w * (double(j) + 0.5) + 0.5 * text_width(map.columns[j], font));
  }
  const double top = (map.title.empty() ? 10 : 30) + label_height;
  const double columns = map.cells.empty() ? 0 : double(map.cells[0].size());
  const double width = std::ceil(left + std::max({w * columns, label_reach, text_width(map.caption, font)}) + 10);
  const double grid_bottom = top + h * double(map.rows.size());
  std::string svg = svg_open(width, grid_bottom + (map.caption.empty() ? 10 : 30), font);
  if (!map.title.empty()) svg += svg_title(left, map.title);
  for (size_t j = 0; j < map.columns.size(); ++j)
    svg += fmt::format(R"svg(<text transform="translate({:.1f},{:.1f}) rotate(-60)">{}</text>)svg",
                       left + w * (double(j) + 0.5), top - 6, html_escape(map.columns[j]));
  for (size_t i = 0; i < map.rows.size(); ++i) {
    const double y = top + h * double(i), middle = y + (h - gap) / 2 + 4;
    svg += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="end">{}</text>)svg", left - 6, middle,
                       html_escape(map.rows[i]));
    for (size_t j = 0; j < map.cells[i].size(); ++j) {
      if (!map.cells[i][j]) continue;
      const HeatCell& cell = *map.cells[i][j];
      const double x = left + w * double(j);
      // Touching cells overlap a little, or antialiasing would draw hairlines between them.
      svg += fmt::format(R"svg(<rect x="{:.1f}" y="{:.1f}" width="{:.2f}" height="{:.1f}" fill="{}"{}>)svg", x, y,
                         map.outlined ? w : w + 0.3, h - gap, scale_colour(map.scale, cell.share),
                         map.outlined ? R"svg( stroke="#ddd")svg" : "");
      if (!cell.tooltip.empty()) svg += fmt::format("<title>{}</title>", html_escape(cell.tooltip));
      svg += "</rect>";
      if (!cell.text.empty())
        svg += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" fill="{}">{}</text>)svg", x + w / 2,
                           middle, cell.share > 0.5 ? "white" : "black", html_escape(cell.text));
    }
  }
  if (!map.caption.empty())
    svg += fmt::format(R"svg(<text x="{}" y="{:.1f}">{}</text>)svg", left, grid_bottom + 20, html_escape(map.caption));
  return svg + "</svg>";
}

}  // namespace hyla
