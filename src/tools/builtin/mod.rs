//! The tools every registry offers.
