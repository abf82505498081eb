//! Non-negative least squares: the x ≥ 0 that minimises |Ax − b|₂ (Lawson and Hanson, "Solving
//! Least Squares Problems", 1974, chapter 23), and least absolute deviations built on it
//! ([`nnls_l1`]).
//!
//! Every term of the cost model is a time or a size per unit of work, so a negative coefficient is
//! a fit that explains noise with an unphysical trade between terms; NNLS keeps them physical.
//! The problems are tiny (tens of columns, hundreds of rows) and no kept crate in the workspace's
//! lock file solves them (ndarray has no solver, nalgebra is not a dependency), so this is the
//! textbook active-set method on normal equations, solved by Cholesky. Columns are scaled to unit
//! norm first so the coefficients' different units (ms per GFLOP, ms per layer) do not matter.

/// Solves min |Ax − b| subject to x ≥ 0. `a` is row-major, `rows × cols`. Columns that are all
/// zero get 0.
pub fn nnls(a: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let cols = a.first().map_or(0, Vec::len);
    let norms: Vec<f64> = (0..cols).map(|j| a.iter().map(|r| r[j] * r[j]).sum::<f64>().sqrt()).collect();
    let scaled: Vec<Vec<f64>> =
        a.iter().map(|r| r.iter().zip(&norms).map(|(v, n)| if *n > 0.0 { v / n } else { 0.0 }).collect()).collect();
    let x = active_set(&scaled, b, cols);
    x.iter().zip(&norms).map(|(v, n)| if *n > 0.0 { v / n } else { 0.0 }).collect()
}

/// Rounds of reweighting in [`nnls_l1`]: the mean absolute residual settles to well under a
/// thousandth of itself by then on the cost model's problems.
const L1_ROUNDS: usize = 40;

/// Residuals below this count as this in [`nnls_l1`]'s weights (relative rows: 0.1%), so that a
/// row fitted exactly does not take all the weight.
const L1_FLOOR: f64 = 1e-3;

/// Solves min Σ|Ax − b| subject to x ≥ 0: least absolute deviations, by iteratively reweighted
/// least squares (each row weighted by 1/√|its residual| and solved again with [`nnls`]). The
/// cost model's rows are relative errors, so this minimises their mean absolute value, the
/// figure its targets are stated in; and a run far off its repeats (a host that was busy) counts
/// as one run's error instead of pulling the fit for every run like it.
pub fn nnls_l1(a: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    // |Ax − b| row by row: the round's cost (their sum) and the next round's weights.
    let residuals = |x: &[f64]| -> Vec<f64> {
        a.iter().zip(b).map(|(r, y)| (r.iter().zip(x).map(|(p, q)| p * q).sum::<f64>() - y).abs()).collect()
    };
    let mut x = nnls(a, b);
    let mut best: Option<(f64, Vec<f64>)> = None;
    for round in 0..=L1_ROUNDS {
        let r = residuals(&x);
        let cost: f64 = r.iter().sum();
        if best.as_ref().is_none_or(|(c, _)| cost < *c) {
            best = Some((cost, x.clone()));
        }
        if round == L1_ROUNDS {
            break;
        }
        let w: Vec<f64> = r.iter().map(|e| 1.0 / e.max(L1_FLOOR).sqrt()).collect();
        let rows: Vec<Vec<f64>> = a.iter().zip(&w).map(|(r, w)| r.iter().map(|v| v * w).collect()).collect();
        let rhs: Vec<f64> = b.iter().zip(&w).map(|(y, w)| y * w).collect();
        x = nnls(&rows, &rhs);
    }
    best.map_or(x, |(_, x)| x)
}

fn active_set(a: &[Vec<f64>], b: &[f64], cols: usize) -> Vec<f64> {
    let mut x = vec![0.0; cols];
    let mut passive = vec![false; cols];
    let tol = 1e-12 * (cols.max(1) as f64);
    for _ in 0..(3 * cols + 10) {
        let w = gradient(a, b, &x);
        let next = (0..cols).filter(|&j| !passive[j] && w[j] > tol).max_by(|&i, &j| w[i].total_cmp(&w[j]));
        let Some(j) = next else { break };
        passive[j] = true;
        // Inner loop: step towards the unconstrained solution on the passive set, dropping
        // coefficients that would turn negative.
        for _ in 0..(3 * cols + 10) {
            let z = solve_on(a, b, &passive);
            if (0..cols).all(|k| !passive[k] || z[k] > 0.0) {
                x = z;
                break;
            }
            let alpha = (0..cols)
                .filter(|&k| passive[k] && z[k] <= 0.0)
                .map(|k| x[k] / (x[k] - z[k]))
                .fold(f64::INFINITY, f64::min);
            for k in 0..cols {
                x[k] += alpha * (z[k] - x[k]);
                if passive[k] && x[k] <= tol {
                    passive[k] = false;
                    x[k] = 0.0;
                }
            }
        }
    }
    x
}

/// Aᵀ(b − Ax).
fn gradient(a: &[Vec<f64>], b: &[f64], x: &[f64]) -> Vec<f64> {
    let mut w = vec![0.0; x.len()];
    for (row, bi) in a.iter().zip(b) {
        let r = bi - row.iter().zip(x).map(|(p, q)| p * q).sum::<f64>();
        for (wj, aj) in w.iter_mut().zip(row) {
            *wj += aj * r;
        }
    }
    w
}

/// The least-squares solution over the passive columns, 0 elsewhere.
fn solve_on(a: &[Vec<f64>], b: &[f64], passive: &[bool]) -> Vec<f64> {
    let idx: Vec<usize> = (0..passive.len()).filter(|&j| passive[j]).collect();
    let n = idx.len();
    let mut m = vec![vec![0.0; n]; n];
    let mut v = vec![0.0; n];
    for (row, bi) in a.iter().zip(b) {
        for (p, &i) in idx.iter().enumerate() {
            v[p] += row[i] * bi;
            for (q, &j) in idx.iter().enumerate() {
                m[p][q] += row[i] * row[j];
            }
        }
    }
    // A whisker of ridge keeps collinear columns (two terms that grow together over the data)
    // solvable; it is far below any column's unit norm.
    for (p, r) in m.iter_mut().enumerate() {
        r[p] += 1e-10;
    }
    let sol = cholesky_solve(m, v);
    let mut z = vec![0.0; passive.len()];
    for (p, &i) in idx.iter().enumerate() {
        z[i] = sol[p];
    }
    z
}

fn cholesky_solve(mut m: Vec<Vec<f64>>, mut v: Vec<f64>) -> Vec<f64> {
    let n = v.len();
    for j in 0..n {
        let d = (m[j][j] - (0..j).map(|k| m[j][k] * m[j][k]).sum::<f64>()).max(1e-300).sqrt();
        m[j][j] = d;
        for i in j + 1..n {
            m[i][j] = (m[i][j] - (0..j).map(|k| m[i][k] * m[j][k]).sum::<f64>()) / d;
        }
    }
    for i in 0..n {
        v[i] = (v[i] - (0..i).map(|k| m[i][k] * v[k]).sum::<f64>()) / m[i][i];
    }
    for i in (0..n).rev() {
        v[i] = (v[i] - (i + 1..n).map(|k| m[k][i] * v[k]).sum::<f64>()) / m[i][i];
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn recovers_a_non_negative_solution_exactly() {
        let a = vec![vec![1.0, 0.0, 2.0], vec![0.0, 1.0, 1.0], vec![1.0, 1.0, 0.0], vec![2.0, 0.5, 1.0]];
        let x0 = [0.5, 2.0, 3.0];
        let b: Vec<f64> = a.iter().map(|r| r.iter().zip(&x0).map(|(p, q)| p * q).sum()).collect();
        let x = nnls(&a, &b);
        for (got, want) in x.iter().zip(&x0) {
            assert!((got - want).abs() < 1e-9, "{x:?}");
        }
    }

    /// Each column enters the solution in an outer step of its own: a problem whose solution needs
    /// all of its 4 or 14 columns (more than the cost model's terms of one family) is solved whole.
    #[test]
    fn every_column_a_solution_needs_enters_it() {
        for cols in [4, 14] {
            let a: Vec<Vec<f64>> = (0..20)
                .map(|i| (0..cols).map(|j| ((i * 7 + j * 13) % 11) as f64 + if i == j { 20.0 } else { 0.0 }).collect())
                .collect();
            let x0: Vec<f64> = (1..=cols).map(|j| j as f64).collect();
            let b: Vec<f64> = a.iter().map(|r| r.iter().zip(&x0).map(|(p, q)| p * q).sum()).collect();
            let x = nnls(&a, &b);
            for (got, want) in x.iter().zip(&x0) {
                assert!((got - want).abs() < 1e-6 * want, "{cols} columns: {x:?}");
            }
        }
    }

    /// A column enters only where its gradient is above the noise floor, 1e-12 per column of the
    /// (unit-norm) problem: with two columns a right side of 1e-12 is noise, one of 3e-12 is not.
    #[test]
    fn a_gradient_below_the_noise_floor_enters_nothing() {
        let a = vec![vec![1.0, 0.0], vec![0.0, 1.0]];
        assert_eq!(nnls(&a, &[1e-12, 0.0]), [0.0, 0.0]);
        let x = nnls(&a, &[3e-12, 0.0]);
        assert!((x[0] - 3e-12).abs() < 1e-18 && x[1] == 0.0, "{x:?}");
    }

    #[test]
    fn a_coefficient_that_would_be_negative_is_held_at_zero() {
        // b = 2·col0 − 1·col1: unconstrained least squares gives −1; NNLS must give x1 = 0 and
        // the best fit of b by col0 alone.
        let a = vec![vec![1.0, 1.0], vec![2.0, 0.0], vec![3.0, 1.0]];
        let b = [1.0, 4.0, 5.0];
        let x = nnls(&a, &b);
        assert_eq!(x[1], 0.0);
        let best = (1.0 + 8.0 + 15.0) / 14.0;
        assert!((x[0] - best).abs() < 1e-9, "{x:?}");
    }

    /// A line through five points, one of them far off: least absolute deviations pass through
    /// the other four; least squares is pulled towards the outlier.
    #[test]
    fn absolute_deviations_pass_by_an_outlier() {
        let a: Vec<Vec<f64>> = (1..=5).map(|i| vec![1.0, f64::from(i)]).collect();
        let mut b: Vec<f64> = (1..=5).map(|i| 2.0 + 3.0 * f64::from(i)).collect();
        b[4] += 10.0;
        let x = nnls_l1(&a, &b);
        assert!((x[0] - 2.0).abs() < 0.01 && (x[1] - 3.0).abs() < 0.01, "{x:?}");
        let ls = nnls(&a, &b);
        assert!((ls[1] - 3.0).abs() > 0.5, "least squares too: {ls:?}");
        // Never worse in its own measure than the least-squares start.
        let sad = |x: &[f64]| a.iter().zip(&b).map(|(r, y)| (r[0] * x[0] + r[1] * x[1] - y).abs()).sum::<f64>();
        assert!(sad(&x) <= sad(&ls));
    }

    /// A column is scaled by its Euclidean norm, whatever its signs: one of negative entries, or
    /// of entries that sum to zero, is solved as any other (a norm taken from the entries' sum
    /// would be undefined or zero there and drop the column).
    #[test]
    fn columns_of_negative_entries_are_solved() {
        let a = vec![vec![-1.0, 1.0], vec![-2.0, -1.0], vec![0.0, 0.0]];
        let x = nnls(&a, &[1.0, -7.0, 0.0]);
        assert!((x[0] - 2.0).abs() < 1e-9 && (x[1] - 3.0).abs() < 1e-9, "{x:?}");
    }

    #[test]
    fn zero_columns_get_zero() {
        let a = vec![vec![1.0, 0.0], vec![2.0, 0.0]];
        let x = nnls(&a, &[2.0, 4.0]);
        assert!((x[0] - 2.0).abs() < 1e-9 && x[1] == 0.0, "{x:?}");
    }

    /// The exact answer of a small problem: the least-squares fit on each set of columns (by
    /// Gauss-Jordan elimination on the normal equations, apart from the solver under test), the
    /// best among those whose coefficients are all positive, 0 elsewhere.
    fn by_every_column_set(a: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
        let cols = a[0].len();
        let cost = |x: &[f64]| {
            a.iter().zip(b).map(|(r, y)| (r.iter().zip(x).map(|(p, q)| p * q).sum::<f64>() - y).powi(2)).sum::<f64>()
        };
        let mut best = (cost(&vec![0.0; cols]), vec![0.0; cols]);
        for set in 1..(1usize << cols) {
            let idx: Vec<usize> = (0..cols).filter(|j| set >> j & 1 == 1).collect();
            let n = idx.len();
            // [AᵀA | Aᵀb] over the set's columns, reduced to [I | x].
            let mut m: Vec<Vec<f64>> = idx
                .iter()
                .map(|&i| {
                    let mut row: Vec<f64> = idx.iter().map(|&j| a.iter().map(|r| r[i] * r[j]).sum()).collect();
                    row.push(a.iter().zip(b).map(|(r, y)| r[i] * y).sum());
                    row
                })
                .collect();
            for c in 0..n {
                let p = (c..n).max_by(|&i, &j| m[i][c].abs().total_cmp(&m[j][c].abs())).unwrap();
                m.swap(c, p);
                let d = m[c][c];
                m[c].iter_mut().for_each(|v| *v /= d);
                for r in 0..n {
                    if r != c {
                        let f = m[r][c];
                        let pivot = m[c].clone();
                        m[r].iter_mut().zip(&pivot).for_each(|(v, q)| *v -= f * q);
                    }
                }
            }
            let mut x = vec![0.0; cols];
            for (k, &j) in idx.iter().enumerate() {
                x[j] = m[k][n];
            }
            if idx.iter().all(|&j| x[j] > 0.0) && cost(&x) < best.0 {
                best = (cost(&x), x);
            }
        }
        best.1
    }

    /// Problems whose answer holds some coefficients at 0 after they entered: the step towards the
    /// passive set's solution stops where the first coefficient reaches 0, which leaves the set.
    /// Every answer is the exact one, its zeros exactly 0.
    #[test]
    fn coefficients_that_turn_negative_leave_at_the_boundary() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut held = 0;
        for case in 0..2000 {
            // 2 to 8 columns, more rows than columns (one answer).
            let cols = 2 + case % 7;
            let rows = cols + 2 + case % 6;
            // Columns that overlap (all positive entries): fits on some of them push others below 0.
            let a: Vec<Vec<f64>> = (0..rows).map(|_| (0..cols).map(|_| 0.2 + next()).collect()).collect();
            let b: Vec<f64> = (0..rows).map(|_| 4.0 * next() - 1.0 - (case % 4) as f64 * next()).collect();
            let (x, want) = (nnls(&a, &b), by_every_column_set(&a, &b));
            for (got, w) in x.iter().zip(&want) {
                if *w == 0.0 {
                    assert_eq!(*got, 0.0, "case {case}: {x:?}, want {want:?}");
                } else {
                    assert!((got - w).abs() <= 1e-7 * (1.0 + w.abs()), "case {case}: {x:?}, want {want:?}");
                }
            }
            held += usize::from(want.contains(&0.0) && want.iter().any(|&w| w > 0.0));
        }
        // Most problems hold some coefficient at 0 and fit with others: the case this is about.
        assert!(held >= 1200, "{held} of 2000 problems hold a coefficient at 0");
    }

    proptest! {
        /// The KKT conditions of the problem hold at the answer: x ≥ 0, the gradient Aᵀ(b − Ax)
        /// is ≤ 0 where x = 0 and 0 where x > 0.
        #[test]
        fn kkt_conditions_hold(
            rows in prop::collection::vec(prop::collection::vec(0.0f64..10.0, 3), 4..12),
            b in prop::collection::vec(-5.0f64..20.0, 12),
        ) {
            let b = &b[..rows.len()];
            let x = nnls(&rows, b);
            let w = gradient(&rows, b, &x);
            let scale = 1e-6 * (1.0 + b.iter().map(|v| v.abs()).sum::<f64>()) * 100.0;
            for (xj, wj) in x.iter().zip(&w) {
                prop_assert!(*xj >= 0.0);
                if *xj > 1e-9 { prop_assert!(wj.abs() < scale, "x {x:?} w {w:?}"); }
                else { prop_assert!(*wj < scale, "x {x:?} w {w:?}"); }
            }
        }
    }
}
