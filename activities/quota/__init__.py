"""A model call's admission by its resource's quota."""
