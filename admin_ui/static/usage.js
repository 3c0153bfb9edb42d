// The usage page's charts: fetch /ui/usage/series.json (the page's filters) and draw each chart
// with uPlot. No inline script (the dashboard's Content-Security-Policy): the data URL is in
// the container's data-series-url attribute.
(function () {
  "use strict";

  var COLORS = ["#2452c9", "#d1495b", "#2e933c", "#edae49", "#6f42c1", "#00798c", "#8c564b",
    "#e377c2", "#7f7f7f", "#17becf"];

  function formatValue(unit, value) {
    if (value === null || value === undefined) {
      return "—";
    }
    if (unit === "ratio") {
      return (value * 100).toFixed(1) + "%";
    }
    if (unit === "cost") {
      return value >= 100 ? value.toFixed(0) : value.toPrecision(3);
    }
    if (unit === "ms") {
      return value >= 100 ? value.toFixed(0) + " ms" : value.toPrecision(3) + " ms";
    }
    return Math.round(value).toLocaleString();
  }

  // Whether a line has a value with no value on either side: a line alone cannot show it
  // (a day in hour buckets with requests in one hour has one latency value), a point can.
  function hasLonePoint(data) {
    return data.some(function (v, i) {
      return v !== null && (i === 0 || data[i - 1] === null) &&
        (i === data.length - 1 || data[i + 1] === null);
    });
  }

  // Tick labels with as many decimals as the ticks' spacing needs, so that no two read the
  // same ("36.4 ms" five times over a narrow range); recorded on the chart's box.
  function axisLabels(chart, box) {
    return function (u, ticks, axisIdx, space, incr) {
      var labels;
      if (chart.unit === "ms" && incr > 0) {
        var decimals = Math.max(0, Math.min(6, -Math.floor(Math.log10(incr) + 1e-9)));
        labels = ticks.map(function (v) { return v.toFixed(decimals) + " ms"; });
      } else if (chart.unit === "ratio" && incr > 0) {
        var places = Math.max(1, Math.min(6, -Math.floor(Math.log10(incr * 100) + 1e-9)));
        labels = ticks.map(function (v) { return (v * 100).toFixed(places) + "%"; });
      } else {
        labels = ticks.map(function (v) { return formatValue(chart.unit, v); });
      }
      box.setAttribute("data-y-labels", labels.join("|"));
      return labels;
    };
  }

  function chartOptions(chart, width, box) {
    var series = [{ label: "time" }];
    chart.series.forEach(function (line, i) {
      series.push({
        label: line.label,
        stroke: COLORS[i % COLORS.length],
        width: 1.5,
        spanGaps: false,
        points: { show: hasLonePoint(line.data), size: 6, fill: COLORS[i % COLORS.length] },
        value: function (u, v) { return formatValue(chart.unit, v); }
      });
    });
    return {
      width: width,
      height: 220,
      series: series,
      scales: { x: { time: true }, y: chart.unit === "ratio" ? { range: [0, 1] } : {} },
      axes: [
        {},
        { values: axisLabels(chart, box), size: 80 }
      ]
    };
  }

  function draw(container, data) {
    container.textContent = "";
    // Every box first, then the plots: a box's width is known once the grid holds them all.
    var boxes = data.charts.map(function (chart) {
      var box = document.createElement("figure");
      box.className = "chart";
      box.id = "chart-" + chart.id;
      box.setAttribute("aria-label", chart.title);
      var title = document.createElement("h3");
      title.textContent = chart.title;
      box.appendChild(title);
      container.appendChild(box);
      return box;
    });
    var plots = data.charts.map(function (chart, i) {
      var box = boxes[i];
      var columns = [data.x];
      chart.series.forEach(function (line) { columns.push(line.data); });
      var options = chartOptions(chart, Math.max(280, box.clientWidth - 24), box);
      var plot = new window.uPlot(options, columns, box);
      box.setAttribute("data-drawn", "true");
      box.setAttribute("data-points", String(data.x.length));
      return { plot: plot, box: box };
    });
    var status = document.getElementById("chart-status");
    if (status) {
      status.setAttribute("data-requests", String(data.requests));
      status.textContent = data.requests
        ? data.requests.toLocaleString() + " requests in " + data.x.length + " " + data.bucket + " buckets."
        : "No requests in this window: the charts are empty.";
    }
    container.setAttribute("data-drawn", "true");
    window.addEventListener("resize", function () {
      plots.forEach(function (p) {
        p.plot.setSize({ width: Math.max(280, p.box.clientWidth - 24), height: 220 });
      });
    });
  }

  function fail(container, message) {
    var status = document.getElementById("chart-status");
    if (status) {
      status.textContent = "The charts could not be loaded: " + message;
      status.className = "chart-status error";
      status.setAttribute("role", "alert");
    }
    container.setAttribute("data-drawn", "error");
  }

  function load() {
    var container = document.getElementById("usage-charts");
    if (!container || !window.uPlot) {
      return;
    }
    fetch(container.getAttribute("data-series-url"), {
      credentials: "same-origin",
      headers: { accept: "application/json" }
    }).then(function (response) {
      return response.json().then(function (body) {
        if (!response.ok) {
          throw new Error(body && body.error ? body.error.message : "HTTP " + response.status);
        }
        return body;
      });
    }).then(function (data) { draw(container, data); })
      .catch(function (error) { fail(container, error.message); });
  }

  // Picking a preset window clears a custom from / to (which would otherwise win).
  function presets() {
    var range = document.getElementById("field-range");
    if (!range) {
      return;
    }
    range.addEventListener("change", function () {
      if (range.value !== "custom") {
        ["field-from", "field-to"].forEach(function (id) {
          var input = document.getElementById(id);
          if (input) { input.value = ""; }
        });
      }
    });
  }

  function start() {
    presets();
    load();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
