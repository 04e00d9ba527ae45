//! Line plots as PNG, drawn here: axes with numbered ticks (a built-in 5×7 digit font), one
//! coloured polyline per series, gaps where a series has no value. Titles and legends live in the
//! HTML around the image.

/// Plot colours (RGB), one per series in order.
pub const COLORS: [[u8; 3]; 6] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
];

const W: usize = 640;
const H: usize = 300;
const LEFT: usize = 64;
const RIGHT: usize = 12;
const TOP: usize = 12;
const BOTTOM: usize = 28;

/// 5×7 glyphs (rows top to bottom, 5 bits each, high bit left).
fn glyph(c: char) -> Option<[u8; 7]> {
    Some(match c {
        '0' => [0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e],
        '1' => [0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e],
        '2' => [0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f],
        '3' => [0x1e, 0x01, 0x01, 0x0e, 0x01, 0x01, 0x1e],
        '4' => [0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02],
        '5' => [0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e],
        '6' => [0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e],
        '7' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e],
        '9' => [0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c],
        '.' => [0, 0, 0, 0, 0, 0x0c, 0x0c],
        '-' => [0, 0, 0, 0x1f, 0, 0, 0],
        '+' => [0, 0x04, 0x04, 0x1f, 0x04, 0x04, 0],
        'e' => [0, 0, 0x0e, 0x11, 0x1f, 0x10, 0x0e],
        _ => return None,
    })
}

struct Canvas {
    pixels: Vec<u8>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas {
            pixels: vec![255; W * H * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, rgb: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < W && (y as usize) < H {
            let i = (y as usize * W + x as usize) * 3;
            self.pixels[i..i + 3].copy_from_slice(&rgb);
        }
    }

    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), rgb: [u8; 3], thick: bool) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.set(x, y, rgb);
            if thick {
                self.set(x + 1, y, rgb);
                self.set(x, y + 1, rgb);
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Text with its top-left corner at (x, y).
    fn text(&mut self, x: i64, y: i64, s: &str) {
        for (i, c) in s.chars().enumerate() {
            if let Some(rows) = glyph(c) {
                for (r, bits) in rows.iter().enumerate() {
                    for b in 0..5 {
                        if bits & (0x10 >> b) != 0 {
                            self.set(x + i as i64 * 6 + b, y + r as i64, [40, 40, 40]);
                        }
                    }
                }
            }
        }
    }
}

/// A tick label: three significant digits, scientific when very large or small.
pub fn tick_label(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-2..1e5).contains(&a) {
        return format!("{v:.1e}");
    }
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_owned()
    }
}

/// Round tick values covering `[lo, hi]`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    (0..)
        .map(|i| first + i as f64 * step)
        .take_while(|t| *t <= hi + step * 1e-9)
        .collect()
}

/// One series: points `(x, y)`; `None` y leaves a gap.
pub struct Series<'a> {
    pub points: &'a [(f64, Option<f64>)],
}

/// Renders the series into a PNG.
pub fn line_plot(series: &[Series<'_>]) -> Vec<u8> {
    let mut c = Canvas::new();
    let values = series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|&(x, y)| y.map(|y| (x, y))))
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in values {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 - x0 < 1e-12 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-12 {
        let pad = y0.abs().max(1.0) * 0.05;
        (y0, y1) = (y0 - pad, y1 + pad);
    } else {
        let pad = (y1 - y0) * 0.05;
        (y0, y1) = (y0 - pad, y1 + pad);
    }
    let (pw, ph) = ((W - LEFT - RIGHT) as f64, (H - TOP - BOTTOM) as f64);
    let px = |x: f64| LEFT as i64 + ((x - x0) / (x1 - x0) * pw).round() as i64;
    let py = |y: f64| (H - BOTTOM) as i64 - ((y - y0) / (y1 - y0) * ph).round() as i64;
    let grid = [225, 225, 225];
    for t in ticks(y0, y1) {
        let y = py(t);
        c.line((LEFT as i64, y), ((W - RIGHT) as i64, y), grid, false);
        let label = tick_label(t);
        c.text(LEFT as i64 - 6 - 6 * label.len() as i64, y - 3, &label);
    }
    for t in ticks(x0, x1) {
        let x = px(t);
        c.line((x, TOP as i64), (x, (H - BOTTOM) as i64), grid, false);
        let label = tick_label(t);
        c.text(x - 3 * label.len() as i64, (H - BOTTOM) as i64 + 8, &label);
    }
    let axis = [90, 90, 90];
    let (l, b) = (LEFT as i64, (H - BOTTOM) as i64);
    c.line((l, TOP as i64), (l, b), axis, false);
    c.line((l, b), ((W - RIGHT) as i64, b), axis, false);
    for (i, s) in series.iter().enumerate() {
        let rgb = COLORS[i % COLORS.len()];
        let mut prev: Option<(i64, i64)> = None;
        for &(x, y) in s.points {
            match y.filter(|y| y.is_finite()) {
                Some(y) => {
                    let p = (px(x), py(y));
                    match prev {
                        Some(q) => c.line(q, p, rgb, true),
                        None => {
                            for d in -1..=1 {
                                c.line((p.0 - 1, p.1 + d), (p.0 + 1, p.1 + d), rgb, false);
                            }
                        }
                    }
                    prev = Some(p);
                }
                None => prev = None,
            }
        }
    }
    encode_png(&c.pixels)
}

fn encode_png(rgb: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, W as u32, H as u32);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder
        .write_header()
        .expect("invariant: writing to memory succeeds");
    writer
        .write_image_data(rgb)
        .expect("invariant: the buffer has the image's size");
    writer
        .finish()
        .expect("invariant: writing to memory succeeds");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_ticks() {
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(3.0), "3");
        assert_eq!(tick_label(0.001234), "1.2e-3");
        assert_eq!(tick_label(-0.0), "0");
        let t = ticks(0.0, 1.0);
        assert_eq!(t, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    }

    #[test]
    fn png_decodes_with_the_series_drawn() {
        let points = [
            (0.0, Some(0.0)),
            (1.0, Some(1.0)),
            (2.0, None),
            (3.0, Some(0.5)),
        ];
        let bytes = line_plot(&[Series { points: &points }]);
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (W as u32, H as u32));
        let blue = buf.chunks(3).filter(|p| p == &COLORS[0]).count();
        assert!(blue > 100, "the line is drawn ({blue} pixels)");
    }
}
