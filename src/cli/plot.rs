//! SVG line charts for reports.

use anyhow::Context;
use plotters::prelude::*;
use std::path::Path;

/// Writes an SVG chart with one line per series.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    x_range: (f64, f64),
    series: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
        root.fill(&WHITE)?;
        let ys = series.iter().flat_map(|(_, pts)| pts.iter().map(|p| p.1));
        let y_max = ys.fold(1.0f64, f64::max) * 1.05;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range.0..x_range.1, 0.0..y_max)?;
        chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw()?;
        for (i, (name, points)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("{e}")).with_context(|| format!("drawing {}", path.display()))
}
