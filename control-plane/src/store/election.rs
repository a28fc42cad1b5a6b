//! Leader election over any [`super::Store`] (to be written).
