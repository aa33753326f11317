#pragma once
// The charts of the self-contained HTML reports (training, RL, image and long-context evaluation):
// inline SVG elements drawn from the data, with round axes; no scripts, no external resources.
// Text passed in is escaped here.
#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace hyla {

// A chart axis: the range it draws and its ticks, at multiples of a round step (1, 2 or 5 × 10^k).
struct Axis {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> ticks;
};

// The value axis for data in [lo, hi]: from the step's multiple at or below lo to the one at or above
// hi, every multiple between ticked. It never goes below 0 when lo is not below 0, so a learning
// rate warming up from 0 gets no negative tick.
Axis value_axis(double lo, double hi);

// The step axis for steps lo..hi: exactly that range, ticked at the round multiples inside it.
Axis step_axis(double lo, double hi);

// A tick's text with as many decimals as the step needs ("0.0015" for a step of 5e-4, "1200" for 200).
std::string tick_label(double value, double step);

struct ChartSeries {
  std::string name;
  std::string colour;                             // empty: the next of a fixed palette
  std::vector<std::pair<double, double>> points;  // (step, value); non-finite values are left out
  bool line = true, dots = false;                 // dots carry their value as a tooltip
};

// A dashed vertical line at a step, labelled (a curriculum stage's start).
struct ChartMark {
  double step;
  std::string label;
};

struct LineChart {
  std::string title;
  std::vector<ChartSeries> series;
  std::vector<ChartMark> marks;
  double reference = NAN;  // a labelled horizontal line where finite (the data's unigram entropy)
  std::string reference_label;
};

// Steps across, values up, the legend in the title row; a paragraph saying so when there is no
// data. Every value these reports chart is non-negative, and the value axis keeps to it.
std::string line_chart_svg(const LineChart& chart);

struct Rgb {
  double r, g, b;
};

// The colour at `share` (clamped to [0, 1]) on a scale through evenly spaced `stops`: "rgb(r,g,b)".
std::string scale_colour(std::span<const Rgb> stops, double share);

struct HeatCell {
  double share = 0;     // where its colour sits on the map's scale
  std::string text;     // written in the cell; empty for none
  std::string tooltip;  // empty for none
};

// A grid of coloured cells: row labels on the left, column labels (slanted) above.
struct HeatMap {
  std::string title;                                        // above the grid; empty for none
  std::vector<std::string> rows, columns;                   // the labels; columns may be empty
  std::vector<std::vector<std::optional<HeatCell>>> cells;  // [row][column]; empty: left blank
  std::vector<Rgb> scale;                                   // light to dark: text on the darker half is white
  double cell_width = 34, cell_height = 34;
  // Cells outlined (a few large ones), or touching along a row with rows 2 px apart (many narrow
  // ones, where outlines would hide the colours).
  bool outlined = true;
  std::string caption;  // below the grid; empty for none
};

std::string heat_map_svg(const HeatMap& map);

}  // namespace hyla
