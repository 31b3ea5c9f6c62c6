"""What a bundle is and how it is checked: the contract, its files and tensors, the model's
configuration, the memory layout by formula, and whether this machine fits it."""
