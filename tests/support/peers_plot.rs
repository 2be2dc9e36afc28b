//! GPU allocation over time of one peer scenario under each autoscaler (issue #46): an SVG of two
//! panels sharing the time axis (physical GPUs the nodes hold; the share of the devices they
//! advertise that bound pods hold) and the samples as CSV. Hand-written SVG: two polylines per
//! autoscaler need no plotting crate.
#![allow(dead_code)]

use crate::peers::Figures;
use std::fmt::Write as _;

const WIDTH: f64 = 780.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 40.0;
const PANEL: f64 = 190.0;
const GAP: f64 = 55.0;
const COLOURS: &[&str] = &["#1b9e77", "#d95f02", "#e7298a", "#7570b3", "#66a61e"];

/// File-name stem for a scenario's name: lower case, runs of other characters as one `-`.
pub fn slug(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

/// The samples of every run: `autoscaler,seconds,physical,advertised,used`.
pub fn csv(runs: &[Figures]) -> String {
    let mut out = String::from("autoscaler,seconds,physical_gpus,advertised_devices,used_devices\n");
    for f in runs {
        for (t, s) in &f.series {
            writeln!(out, "{},{t:.2},{},{},{}", f.autoscaler, s.physical, s.advertised, s.used).unwrap();
        }
    }
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The smallest of 1, 2, 5 × 10^k at or above `v` (a round top for an axis).
fn round_up(v: f64) -> f64 {
    let mut step = 1.0;
    loop {
        for m in [1.0, 2.0, 5.0] {
            if m * step >= v {
                return m * step;
            }
        }
        step *= 10.0;
    }
}

/// The two panels for `runs` of the scenario `title`.
pub fn svg(title: &str, runs: &[Figures]) -> String {
    let t_max = round_up(runs.iter().flat_map(|f| f.series.iter().map(|(t, _)| *t)).fold(10.0, f64::max));
    let gpus_max = round_up(
        runs.iter().flat_map(|f| f.series.iter().map(|(_, s)| s.physical as f64)).fold(1.0, f64::max),
    );
    let plot_w = WIDTH - LEFT - RIGHT;
    let height = TOP + 2.0 * PANEL + GAP + 45.0;
    let x = |t: f64| LEFT + t / t_max * plot_w;
    let mut out = String::new();
    writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    )
    .unwrap();
    writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#).unwrap();
    writeln!(out, r#"<text x="{LEFT}" y="20" font-size="14">{}</text>"#, escape(title)).unwrap();
    let panels: [(&str, f64, f64); 2] =
        [("physical GPUs held", gpus_max, TOP), ("% of advertised devices bound", 100.0, TOP + PANEL + GAP)];
    for (label, y_max, top) in panels {
        let bottom = top + PANEL;
        writeln!(out, r##"<text x="{LEFT}" y="{}" fill="#444">{label}</text>"##, top - 6.0).unwrap();
        for i in 0..=5 {
            let v = y_max * f64::from(i) / 5.0;
            let y = bottom - v / y_max * PANEL;
            writeln!(
                out,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                y + 4.0
            )
            .unwrap();
        }
        for i in 0..=5 {
            let t = t_max * f64::from(i) / 5.0;
            writeln!(out, r#"<text x="{:.1}" y="{}" text-anchor="middle">{t}</text>"#, x(t), bottom + 16.0)
                .unwrap();
        }
        writeln!(
            out,
            r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL}" fill="none" stroke="#888"/>"##
        )
        .unwrap();
        for (f, colour) in runs.iter().zip(COLOURS.iter().cycle()) {
            let points: Vec<String> = f
                .series
                .iter()
                .map(|(t, s)| {
                    let v = match top == TOP {
                        true => s.physical as f64,
                        false if s.advertised == 0 => 0.0,
                        // Nodes and pods are read one after the other: a pod bound between the two
                        // reads can outrun the count of its node's devices.
                        false => (100.0 * s.used as f64 / s.advertised as f64).min(100.0),
                    };
                    format!("{:.1},{:.1}", x(*t), bottom - v / y_max * PANEL)
                })
                .collect();
            writeln!(
                out,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                points.join(" ")
            )
            .unwrap();
        }
    }
    writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds from the scenario's start</text>"#,
        LEFT + plot_w / 2.0,
        height - 8.0
    )
    .unwrap();
    for (i, (f, colour)) in runs.iter().zip(COLOURS.iter().cycle()).enumerate() {
        let y = TOP + 14.0 + 20.0 * i as f64;
        let lx = LEFT + plot_w + 14.0;
        writeln!(
            out,
            r#"<line x1="{lx}" x2="{}" y1="{y}" y2="{y}" stroke="{colour}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            lx + 18.0,
            lx + 24.0,
            y + 4.0,
            escape(f.autoscaler)
        )
        .unwrap();
    }
    out.push_str("</svg>\n");
    out
}
