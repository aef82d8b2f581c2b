//! The CPU backend's activation tensor: a row-major f32 matrix in host memory.

/// A row-major `[rows, cols]` f32 matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl CpuTensor {
    /// A tensor over `data` (`rows * cols` values). Panics on a length mismatch (an engine bug,
    /// never user data: every shape is validated at load).
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "CpuTensor shape");
        Self { rows, cols, data }
    }

    /// A zero tensor.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self::new(rows, cols, vec![0.0; rows * cols])
    }

    /// Rows (tokens).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The values, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The values, row-major, mutably.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// The values, by value.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }
}
