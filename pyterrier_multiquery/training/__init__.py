"""Contrastive losses shared by the methods' trainers."""
